"""A megatron snapshot end to end through the real writer and the GU's converter, driven by the
manifest alone: each rank's ``SnapshotWriter`` (as in separate processes, one shared run id)
writes its shard, the last publishes; ``GuConverter`` without a name map reads the layout's
naming, unfuses, renames, merges and trims the vocab padding back to the HF checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.parity.models import build_parity_model
from mindspeed_rl.models.training.megatron.hf_mapping import megatron_shard
from mindspeed_rl.models.training.megatron.hf_sources import DictSource
from mindspeed_rl.models.training.megatron.param_names import export_shard, megatron_names
from mindspeed_rl.weights import megatron_rules
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.weights.manifest import SnapshotManifest
from mindspeed_rl.weights.megatron_dims import ShardCoords, load_dims
from mindspeed_rl.workers.megatron_engines import first_holders, layout_rank


def _export(model: Path, root: Path, tp: int, ep: int, *, with_naming: bool = True) -> SnapshotManifest:
    dims, source = load_dims(model), DictSource(load_file(str(model / "model.safetensors")))
    layout = megatron_rules.training_layout(
        tp_size=tp, pp_size=1, ep_size=ep, dims=dims if with_naming else None
    )
    futures = []
    for e in range(ep):
        for t in range(tp):
            coords = ShardCoords(tp_rank=t, tp_size=tp, ep_rank=e, ep_size=ep)
            state = {n: megatron_shard(n, dims, coords, source) for n in megatron_names(dims, coords)}
            writer = SnapshotWriter(root, keep_last=2, run_id="run0")
            futures.append(
                writer.export(0, export_shard(state, dims, coords).items(), layout, layout_rank(coords))
            )
            writer.close()
    published = [f.result().published for f in futures if f.result().published is not None]
    assert len(published) == 1, "exactly one rank publishes"
    return SnapshotManifest.load(published[0].path)


@pytest.mark.parametrize(("family", "tp", "ep"), [("qwen3", 2, 1), ("qwen3_moe", 1, 2)])
def test_gu_converts_a_megatron_snapshot_to_the_hf_weights(
    tmp_path: Path, family: str, tp: int, ep: int
) -> None:
    model = build_parity_model(tmp_path / "hf", family)
    manifest = _export(model, tmp_path / "snap", tp, ep)
    assert len(manifest.shards) == tp * ep
    layout = TrainingLayout.from_json(manifest.layout)
    assert layout.naming is not None and layout.naming["scheme"] == "megatron"
    from mindspeed_rl.weights.store import latest_published

    snapshot = latest_published(tmp_path / "snap")
    assert snapshot is not None
    result = GuConverter(tmp_path / "cache", InferenceLayout()).convert(snapshot)
    assert result.method == "merged"
    got = load_file(str(result.converted.path / "rank-00000.safetensors"))
    want = load_file(str(model / "model.safetensors"))
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_layout_without_naming_keeps_the_training_names(tmp_path: Path) -> None:
    model = build_parity_model(tmp_path / "hf", "qwen3")
    _export(model, tmp_path / "snap", 2, 1, with_naming=False)
    from mindspeed_rl.weights.store import latest_published

    snapshot = latest_published(tmp_path / "snap")
    assert snapshot is not None
    result = GuConverter(tmp_path / "cache", InferenceLayout()).convert(snapshot)
    names = set(load_file(str(result.converted.path / "rank-00000.safetensors")))
    assert "embedding.word_embeddings.weight" in names


def test_only_the_first_rank_of_each_shard_writes() -> None:
    tp2 = [ShardCoords(tp_rank=r % 2, tp_size=2) for r in range(4)]  # TP2 x DP2
    assert [layout_rank(c) for c in tp2] == [0, 1, 0, 1]
    assert first_holders(tp2) == [True, True, False, False]
    ep2 = [ShardCoords(ep_rank=r, ep_size=2) for r in range(2)]  # EP2 inside DP2
    assert first_holders(ep2) == [True, True]


class _ShardEngine:
    """A megatron engine's snapshot side: ``snapshot_shard`` is where the shard is copied to host."""

    def __init__(self, model: Path, coords: ShardCoords) -> None:
        self.dims = load_dims(model)
        self.coords = coords
        self._source = DictSource(load_file(str(model / "model.safetensors")))
        self.copies = 0

    def snapshot_shard(self) -> tuple[dict[str, torch.Tensor], ShardCoords]:
        self.copies += 1
        c = self.coords
        state = {n: megatron_shard(n, self.dims, c, self._source) for n in megatron_names(self.dims, c)}
        return export_shard(state, self.dims, c), c


@pytest.mark.parametrize("global_rank", [0, 1, 2, 3])
def test_a_data_parallel_replica_never_copies_its_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, global_rank: int
) -> None:
    from mindspeed_rl.workers import megatron_engines

    model = build_parity_model(tmp_path / "hf", "qwen3")
    everyone = [ShardCoords(tp_rank=r % 2, tp_size=2) for r in range(4)]  # TP2 x DP2
    monkeypatch.setattr(megatron_engines.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(megatron_engines.dist, "get_rank", lambda: global_rank)
    monkeypatch.setattr(megatron_engines, "host_group", lambda: None)  # no process group in this test
    monkeypatch.setattr(
        megatron_engines.dist,
        "all_gather_object",
        lambda out, _, **kw: out.__setitem__(slice(None), everyone),
    )
    engine = _ShardEngine(model, everyone[global_rank])
    snapshots = megatron_engines.MegatronSnapshots(engine, coords_of=lambda e: e.coords)  # type: ignore[arg-type]
    parts = [snapshots() for _ in range(3)]  # three exports
    writes = global_rank < 2
    assert engine.copies == (3 if writes else 0)
    assert {p.rank for p in parts} == ({global_rank} if writes else {None})
    if writes:
        assert {n for n, _ in parts[0].tensors} == set(engine.snapshot_shard()[0])
    else:
        assert list(parts[0].tensors) == []
    assert parts[0].layout.tp_size == 2
