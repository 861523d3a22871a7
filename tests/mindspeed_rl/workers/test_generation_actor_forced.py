"""Trace replay's forced lengths on a real engine (HF, in-process): every sample has its own length."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import hf_rollout_spec

PROMPTS = {
    "p0": PromptRecord(prompt_id="p0", text="a", token_ids=(5, 6, 7), label=""),
    "p1": PromptRecord(prompt_id="p1", text="b", token_ids=(8, 9), label=""),
}


def make_actor(tmp_path: Path, forced: Mapping[str, tuple[int, ...]]) -> GenerationActor:
    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    # Forced lengths override the cap.
    spec = hf_rollout_spec(model, "generate_config.sampling_config.max_tokens=4", n=3)
    return GenerationActor(spec, str(model), PROMPTS, forced_lengths=forced)


def test_every_sample_gets_its_forced_length(tmp_path: Path) -> None:
    forced = {"p0": (1, 9, 4), "p1": (7, 2, 12)}
    actor = make_actor(tmp_path, forced)
    mb = ScheduledMinibatch(
        minibatch_id=0, prompt_ids=("p1", "p0"), batch_group_id=0, predicted_load=1.0, order_index=0
    )
    done = actor.generate_minibatch(mb)
    got: dict[str, list[int]] = {"p0": [0, 0, 0], "p1": [0, 0, 0]}
    for s in done.samples:
        got[s.prompt_id][s.sample_index] = len(s.response_token_ids)
        assert len(s.rollout_log_probs) == len(s.response_token_ids)
    assert {k: tuple(v) for k, v in got.items()} == forced


def test_forced_lengths_need_one_per_sample(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_samples_per_prompt=3"):
        make_actor(tmp_path, {"p0": (1, 2), "p1": (1, 2, 3)})
