"""The Training Unit (both pipelines train through it) scores multi-turn samples with
``retool_reward`` on the policy's own tokens: a boxed answer that only a tool response holds
earns no credit. Real tiny model tokenizer and reward path; the engine is a recorder (the update
itself is not what is tested here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.rewards import RewardConfig
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.models.tokenizer import load_tokenizer
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import PromptGroup, Sample
from mindspeed_rl.workers.filter_scores import FilterScorer
from mindspeed_rl.workers.training_unit import Engines, SnapshotPart, TrainingUnit

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RETOOL = ("rl_config.verifier_function=[retool_reward]", "rl_config.verifier_weight=[1.0]")


class _Engine:
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def update(self, batch: Any, temperature: float) -> dict[str, float]:
        self.batches.append(batch)
        return {"loss": 0.0, "lr": 1e-3}

    def compute_log_probs(self, batch: Any, temperature: float) -> list[np.ndarray]:
        return [np.asarray(lp) for lp in batch.rollout_log_probs]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("retool") / "model", TINY_TEST_ARCH, seed=0)


def _samples(model: Path, masked: bool) -> tuple[Sample, ...]:
    tok = load_tokenizer(model)
    call = tok.encode("let me run it", add_special_tokens=False)
    tool = tok.encode(" \\boxed{42}", add_special_tokens=False)  # the tool's output, not the model's
    own = tok.encode("so \\boxed{42}", add_special_tokens=False)
    ids = (tuple(call + tool), tuple(own))
    masks = ((1,) * len(call) + (0,) * len(tool), ()) if masked else ((), ())
    return tuple(
        Sample(
            prompt_id="p",
            sample_index=i,
            minibatch_id=0,
            response_token_ids=ids[i],
            rollout_log_probs=(-0.5,) * len(ids[i]),
            reward=None,
            policy_version=0,
            gu_id=0,
            actor_id=0,
            sent_at=0.0,
            loss_mask=masks[i],
        )  # fmt: skip
        for i in range(2)
    )


def _unit(model: Path) -> tuple[TrainingUnit, dict[str, PromptRecord]]:
    overrides = (*RETOOL, "rl_config.n_samples_per_prompt=2")
    spec = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp", overrides)).trainer

    def engines(spec: Any, path: str) -> Engines:
        return Engines(
            engine=_Engine(), reference=None, snapshot=lambda: SnapshotPart(tensors=(), layout=None, rank=0)
        )  # type: ignore[arg-type]

    prompts = {"p": PromptRecord(prompt_id="p", text="6*7", token_ids=(5, 6), label="42")}
    return TrainingUnit(spec, str(model), prompts, engines=engines), prompts


@pytest.mark.parametrize(
    ("masked", "mean"), [(True, (-0.9 + 1.0) / 2), (False, 1.0)], ids=["masked", "unmasked"]
)
def test_training_unit_scores_the_policys_tokens_only(model: Path, masked: bool, mean: float) -> None:
    tu, _ = _unit(model)
    samples = _samples(model, masked)
    metrics = tu.train_step([PromptGroup(prompt_id="p", minibatch_id=0, samples=samples)])
    # masked: the tool's box does not count (-1 + 0.1 for its one tool round); unmasked, the same
    # tokens are all the model's, so the box is its answer.
    assert metrics["reward/retool_reward"] == pytest.approx(mean)


def test_dynamic_sampling_filter_scores_the_same_way(model: Path) -> None:
    # The filter metric as the plan builds it for filter_groups_metric: retool_reward.
    _, prompts = _unit(model)
    scorer = FilterScorer(
        RewardConfig(verifier_function=("retool_reward",), verifier_weight=(1.0,)), str(model)
    )
    try:
        samples = _samples(model, masked=True)
        scorer.score(samples, prompts)
    finally:
        scorer.close()
    assert [s.filter_score for s in samples] == pytest.approx([-0.9, 1.0])
