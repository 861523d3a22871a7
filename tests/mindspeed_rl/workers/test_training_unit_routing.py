"""Routing replay through the workers: a generation actor on the HF engine (tiny Qwen3-MoE) puts
each sample's routing in the sample, it survives pickling (the Training Queue's Ray hop), and the
Training Unit's real torch engine replays it (R3) or its own recompute's routing (R2)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_QWEN3_MOE_ARCH, create_tiny_model
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import PromptGroup, ScheduledMinibatch
from mindspeed_rl.workers.generation_actor import GenerationActor
from mindspeed_rl.workers.training_unit import TrainingUnit
from tests.support.plans import CONFIGS, hf_rollout_spec

PROMPTS = {
    "p0": PromptRecord(prompt_id="p0", text="cp:ab=", token_ids=(5, 6, 7, 8), label="ab"),
    "p1": PromptRecord(prompt_id="p1", text="cp:c=", token_ids=(9, 10), label="c"),
}
MB = ScheduledMinibatch(
    minibatch_id=0, prompt_ids=("p0", "p1"), batch_group_id=0, predicted_load=8.0, order_index=0
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("moe") / "model", TINY_QWEN3_MOE_ARCH, seed=0)


def _trainer(model: Path, mode: str):  # type: ignore[no-untyped-def]
    overrides = (
        f"megatron_training.tokenizer_name_or_path={model}",
        "++actor_config.use_mcore_models=false",
        "++actor_config.expert_model_parallel_size=1",
        "++rl_config.rollout_backend=hf",
        "rl_config.n_samples_per_prompt=2",
        "megatron_training.global_batch_size=2",
        "++rl_config.pipeline=hybrid",
        "actor_config.micro_batch_size=4",
        "rl_config.actor_forward_micro_batch_size=4",
        "rl_config.ref_forward_micro_batch_size=4",
        f"++rl_config.routing_replay={mode}",
    )
    return build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron_moe", overrides)).trainer


def _groups(model: Path, record: bool) -> list[PromptGroup]:
    spec = hf_rollout_spec(model, "generate_config.sampling_config.max_tokens=6")
    actor = GenerationActor(dataclasses.replace(spec, record_routing=record), str(model), PROMPTS)
    done = pickle.loads(pickle.dumps(actor.generate_minibatch(MB)))  # as the queue's Ray hop does
    return [
        PromptGroup(
            prompt_id=pid, minibatch_id=0, samples=tuple(s for s in done.samples if s.prompt_id == pid)
        )
        for pid in MB.prompt_ids
    ]


def test_samples_carry_compact_routing(model: Path) -> None:
    groups = _groups(model, record=True)
    for group in groups:
        prompt = PROMPTS[group.prompt_id].token_ids
        for s in group.samples:
            assert s.routing is not None and s.routing.dtype == "uint8"
            s.routing.check_covers(len(prompt), len(s.response_token_ids), "sample")
            assert s.routing_bytes == (len(prompt) + len(s.response_token_ids) - 1) * 2 * 2
            assert s.routing.array().max() < 4
    assert all(s.routing is None for g in _groups(model, record=False) for s in g.samples)


def test_r3_trains_on_the_rollouts_routing(model: Path) -> None:
    spec = _trainer(model, "R3")
    tu = TrainingUnit(spec, str(model), PROMPTS)
    metrics = tu.train_step(_groups(model, record=True))
    # Same weights, replayed: the recompute used exactly the recorded experts everywhere.
    assert metrics["routing/mismatch_frac"] == 0.0
    assert metrics["routing/recompute_replayed_rows"] > 0
    assert metrics["routing/train_replayed_rows"] > 0
    assert metrics["routing/bytes_per_sample"] > 0
    assert np.isfinite(metrics["actor/loss"])


def test_r3_refuses_a_sample_without_routing(model: Path) -> None:
    tu = TrainingUnit(_trainer(model, "R3"), str(model), PROMPTS)
    with pytest.raises(ValueError, match="carries no MoE routing, but rl_config.routing_replay is R3"):
        tu.train_step(_groups(model, record=False))


def test_r2_replays_the_recomputes_own_routing(model: Path) -> None:
    tu = TrainingUnit(_trainer(model, "R2"), str(model), PROMPTS)
    metrics = tu.train_step(_groups(model, record=False))
    assert "routing/mismatch_frac" not in metrics  # nothing recorded at rollout to compare with
    assert metrics["routing/train_replayed_rows"] == metrics["routing/positions"] * 2  # 2 MoE layers
