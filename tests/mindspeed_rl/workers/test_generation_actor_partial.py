"""A partial rollout on a real engine (HF, in-process, tiny model): a snapshot announced while a
minibatch decodes is loaded between rounds, and the rest of each response comes from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.runtime.segments import TokenSegment
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import CONFIGS, hf_rollout_spec

MB = ScheduledMinibatch(
    minibatch_id=3, prompt_ids=("p0",), batch_group_id=0, predicted_load=6.0, order_index=0
)


class Source:
    """Stands in for the GU's ``newest_converted``: records what the actor asked."""

    def __init__(self) -> None:
        self.snapshot: tuple[str, int, Any] | None = None
        self.asked: list[int] = []

    def newest_converted(self, held_version: int) -> tuple[str, int, Any] | None:
        self.asked.append(held_version)
        snap = self.snapshot
        return snap if snap is not None and snap[1] > held_version else None


def _actor(tmp_path: Path, *overrides: str, source: Source | None = None) -> GenerationActor:
    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    spec = hf_rollout_spec(model, "generate_config.sampling_config.max_tokens=8", *overrides)
    prompt = PromptRecord(prompt_id="p0", text="cp:ab=", token_ids=(5, 6, 7), label="ab")
    # Forced lengths (EOS ignored): the responses are long enough to cross a round boundary.
    return GenerationActor(
        spec,
        str(model),
        {"p0": prompt},
        forced_lengths={"p0": (7, 5)},
        snapshot_source=source,
    )


def _snapshot(root: Path, actor: GenerationActor, version: int) -> Path:
    weights = {k: v + 0.05 for k, v in actor._engine.model.state_dict().items()}  # type: ignore[attr-defined]
    writer = SnapshotWriter(root / "trainer", keep_last=10)
    result = writer.export(version, weights.items(), TrainingLayout()).result()
    writer.close()
    assert result.published is not None
    return (
        GuConverter(root / "gu0", InferenceLayout(), keep_last=10, num_threads=1)
        .convert(result.published)
        .converted.path
    )


def test_announced_snapshot_is_loaded_between_rounds(tmp_path: Path) -> None:
    source = Source()
    actor = _actor(
        tmp_path,
        "rl_config.pipeline=async",
        "rl_config.partial_rollout_max_split=3",
        "rl_config.partial_rollout_chunk_tokens=3",
        source=source,
    )
    source.snapshot = (str(_snapshot(tmp_path, actor, 1)), 1, None)
    receipt, done = actor.generate_with_receipt(MB)
    # Asked after round 1 (held v0: loads v1) and round 2 (held v1: nothing newer); round 3 ends it.
    assert source.asked == [0, 1]
    assert receipt.held_version == 1 and [v for v, _ in receipt.reloads] == [1]
    assert done.policy_version == 0 and done.reload_seconds > 0
    by_index = {s.sample_index: s for s in done.samples}
    assert [len(by_index[j].response_token_ids) for j in (0, 1)] == [7, 5]
    for s in done.samples:  # 3 tokens on the starting weights, the rest on v1
        n = len(s.response_token_ids)
        assert s.policy_version == 0
        assert s.segments == (
            TokenSegment(version=0, num_tokens=3),
            TokenSegment(version=1, num_tokens=n - 3),
        )
    # The next minibatch starts on v1 and, with nothing announced, stays there in one segment.
    _, again = actor.generate_with_receipt(MB)
    assert {s.policy_version for s in again.samples} == {1} and all(not s.segments for s in again.samples)


def test_without_partial_rollouts_nothing_is_asked_mid_minibatch(tmp_path: Path) -> None:
    source = Source()
    actor = _actor(tmp_path, "rl_config.pipeline=async", source=source)
    source.snapshot = (str(_snapshot(tmp_path, actor, 1)), 1, None)
    receipt, done = actor.generate_with_receipt(MB)
    assert source.asked == []  # one call per minibatch: nothing to ask between rounds
    assert receipt.held_version == 0 and receipt.reloads == ()
    assert {s.policy_version for s in done.samples} == {0} and all(not s.segments for s in done.samples)


def test_partial_rollouts_need_the_async_pipeline(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="they need rl_config.pipeline: async"):
        load_config_from_files(CONFIGS, "grpo_tiny_cpu", ("rl_config.partial_rollout_max_split=2",))
