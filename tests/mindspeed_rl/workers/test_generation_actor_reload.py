"""GenerationActor's deferred reload (async path), in-process on the HF engine with a tiny model.

A good snapshot is loaded and stamps later samples with its version; a truncated file, a wrong
checksum or a missing manifest is never loaded: the actor keeps its weights and logs the error.
The same holds where the engine reads the folder itself (``loads_from_path``, as TP > 1 vLLM
does; the HF engine stands in), and a weight of the wrong shape is an error naming it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.weights.manifest import MANIFEST_NAME
from mindspeed_rl.weights.slots import WeightShapeError
from mindspeed_rl.workers.generation_actor import GenerationActor
from tests.support.plans import hf_rollout_spec

_FRESH = itertools.count(1)


@pytest.fixture(scope="module")
def actor(tmp_path_factory: pytest.TempPathFactory) -> GenerationActor:
    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)
    spec = hf_rollout_spec(model, "generate_config.sampling_config.max_tokens=4")
    prompt = PromptRecord(prompt_id="p0", text="cp:ab=", token_ids=(5, 6, 7), label="ab")
    return GenerationActor(spec, str(model), {"p0": prompt}, gu_id=0, actor_id=1)


def _weights(actor: GenerationActor) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in actor._engine.model.state_dict().items()}  # type: ignore[attr-defined]


def _converted_snapshot(root: Path, version: int, weights: dict[str, torch.Tensor]) -> Path:
    writer = SnapshotWriter(root / "trainer", keep_last=10)
    result = writer.export(version, weights.items(), TrainingLayout()).result()
    writer.close()
    assert result.published is not None
    converter = GuConverter(root / "gu0", InferenceLayout(), keep_last=10, num_threads=1)
    return converter.convert(result.published).converted.path


def _shifted(weights: dict[str, torch.Tensor], delta: float) -> dict[str, torch.Tensor]:
    return {k: v + delta if v.is_floating_point() else v for k, v in weights.items()}


def _truncate(path: Path) -> None:
    shard = next(path.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _flip_bytes(path: Path) -> None:
    shard = next(path.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-16:] = bytes(b ^ 0xFF for b in data[-16:])  # same size, different tensor bytes
    shard.write_bytes(bytes(data))


def _drop_manifest(path: Path) -> None:
    (path / MANIFEST_NAME).unlink()


def test_reload_loads_a_newer_snapshot_and_stamps_samples_with_its_version(
    actor: GenerationActor, tmp_path: Path
) -> None:
    target = _shifted(_weights(actor), 0.01)
    path = _converted_snapshot(tmp_path, 1, target)
    result = actor.reload(str(path), 1)
    assert result.status == "loaded" and result.version == 1 and result.load_seconds > 0
    now = _weights(actor)
    assert all(torch.equal(now[k], target[k]) for k in target)
    assert actor.reload(str(path), 1).status == "up_to_date"
    mb = ScheduledMinibatch(
        minibatch_id=7, prompt_ids=("p0",), batch_group_id=0, predicted_load=3.0, order_index=0
    )
    done = actor.generate_minibatch(mb, attempt=2)
    assert done.policy_version == 1 and {s.policy_version for s in done.samples} == {1}
    assert done.attempt == 2 and len(done.samples) == 2


@pytest.mark.parametrize(
    "damage", [_truncate, _flip_bytes, _drop_manifest], ids=["truncated", "checksum", "manifest"]
)
def test_defective_snapshot_is_never_loaded_and_the_actor_keeps_its_weights(
    actor: GenerationActor, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    before, version = _weights(actor), actor.policy_version
    newer = version + next(_FRESH)  # a rejected version is remembered, so each case needs its own
    path = _converted_snapshot(tmp_path, newer, _shifted(before, 0.5))
    damage(path)
    with caplog.at_level(logging.ERROR):
        result = actor.reload(str(path), newer)
    assert result.status == "rejected" and result.version == version and result.reason
    assert actor.policy_version == version
    after = _weights(actor)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert any(f"v{newer}" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


@pytest.mark.parametrize("engine_reads_folder", [False, True], ids=["tensors", "folder"])
def test_a_weight_that_does_not_fit_is_an_error_naming_it_and_nothing_is_loaded(
    actor: GenerationActor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_reads_folder: bool
) -> None:
    monkeypatch.setattr(actor._engine, "loads_from_path", engine_reads_folder, raising=False)
    before, version = _weights(actor), actor.policy_version
    newer = version + next(_FRESH)
    misfit = _shifted(before, 0.5)
    name = "model.layers.0.self_attn.q_proj.weight"
    misfit[name] = misfit[name][:64]  # half the query heads: a snapshot of another model
    path = _converted_snapshot(tmp_path, newer, misfit)
    with pytest.raises(WeightShapeError) as caught:
        actor.reload(str(path), newer)
    message = str(caught.value)
    assert f"{name}: the weight is [64, 64], the engine's slot [128, 64]" in message
    assert "num_attention_heads x head_dim (4 x 32 = 128)" in message
    assert actor.policy_version == version
    after = _weights(actor)
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("damage", [None, _truncate, _flip_bytes], ids=["sound", "truncated", "checksum"])
def test_an_engine_that_reads_the_folder_gets_it_only_once_verified(
    actor: GenerationActor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None] | None,
) -> None:
    """As a TP > 1 vLLM engine reloads: the actor verifies the file streaming, the engine reads it."""
    from mindspeed_rl.weights import shardio

    monkeypatch.setattr(actor._engine, "loads_from_path", True, raising=False)
    read_by_actor: list[str] = []
    monkeypatch.setattr(shardio, "read_tensor", lambda job: read_by_actor.append(job.entry.name))
    before, version = _weights(actor), actor.policy_version
    newer = version + next(_FRESH)
    target = _shifted(before, 0.25)
    path = _converted_snapshot(tmp_path, newer, target)
    if damage is not None:
        damage(path)
    result = actor.reload(str(path), newer)
    assert read_by_actor == [], "the actor keeps no tensor of a folder reload"
    now = _weights(actor)
    if damage is None:
        assert result.status == "loaded" and actor.policy_version == newer
        assert all(torch.equal(now[k], target[k]) for k in target)
    else:
        assert result.status == "rejected" and actor.policy_version == version
        assert all(torch.equal(now[k], before[k]) for k in before)
