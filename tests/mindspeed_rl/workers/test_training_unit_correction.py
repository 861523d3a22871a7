"""The Training Unit hands the engine each sample's behaviour log-probs and version (what the
off-policy correction needs), and reports the engine's ``rollout_corr/*`` metrics at the top level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import PromptGroup, Sample
from mindspeed_rl.workers.training_unit import Engines, SnapshotPart, TrainingUnit

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


class _Engine:
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def update(self, batch: Any, temperature: float) -> dict[str, float]:
        self.batches.append(batch)
        return {"loss": 0.5, "lr": 1e-3, "rollout_corr/is_weight_mean": 1.25}

    def compute_log_probs(self, batch: Any, temperature: float) -> list[np.ndarray]:
        raise AssertionError("decoupled + loglinear needs no extra forward")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tu") / "model", TINY_TEST_ARCH, seed=0)


def test_batch_carries_behaviour_log_probs_and_versions(model: Path) -> None:
    overrides = ("++rollout_correction.mode=decoupled", "++rollout_correction.prox_logp=loglinear",
                 "++rollout_correction.rollout_is=token", "rl_config.n_samples_per_prompt=2")  # fmt: skip
    spec = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp", overrides)).trainer
    engine = _Engine()

    def engines(spec: Any, path: str) -> Engines:
        return Engines(
            engine=engine, reference=None, snapshot=lambda: SnapshotPart(tensors=(), layout=None, rank=0)
        )  # type: ignore[arg-type]

    prompts = {"p": PromptRecord(prompt_id="p", text="ab", token_ids=(5, 6), label="ab")}
    tu = TrainingUnit(spec, str(model), prompts, engines=engines)
    samples = tuple(
        Sample(
            prompt_id="p",
            sample_index=i,
            minibatch_id=0,
            response_token_ids=(7, 8, 9)[: 2 + i],
            rollout_log_probs=(-0.5, -1.0, -1.5)[: 2 + i],
            reward=None,
            policy_version=3 + i,
            gu_id=0,
            actor_id=0,
            sent_at=0.0,
        )  # fmt: skip
        for i in range(2)
    )
    metrics = tu.train_step([PromptGroup(prompt_id="p", minibatch_id=0, samples=samples)])
    (batch,) = engine.batches
    assert [v.tolist() for v in batch.versions] == [[3, 3], [4, 4, 4]]
    assert [lp.tolist() for lp in batch.rollout_log_probs] == [[-0.5, -1.0], [-0.5, -1.0, -1.5]]
    assert [lp.tolist() for lp in batch.old_log_probs] == [[-0.5, -1.0], [-0.5, -1.0, -1.5]]
    assert metrics["rollout_corr/is_weight_mean"] == 1.25 and metrics["actor/loss"] == 0.5
