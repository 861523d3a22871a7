"""The GU's merge streams group by group and writes exactly what a whole-model merge writes.

The reference here is the whole-model pipeline composed of the library's public steps (read every
shard, unfuse + rename, merge, after-merge step, split per rank, ``write_shard`` per rank): the
algorithm the converter ran before it streamed. Each case compares every output file byte for
byte, and the manifests entry for entry.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.parity.models import build_parity_model
from mindspeed_rl.models.training.megatron.hf_mapping import megatron_shard
from mindspeed_rl.models.training.megatron.hf_sources import DictSource
from mindspeed_rl.models.training.megatron.param_names import export_shard, megatron_names
from mindspeed_rl.weights import megatron_rules
from mindspeed_rl.weights.convert import GuConverter, read_training_pieces
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import (
    InferenceLayout,
    PartitionRule,
    PartitionSpec,
    TrainingLayout,
    hf_dense_rules,
)
from mindspeed_rl.weights.manifest import MANIFEST_NAME, SnapshotError, SnapshotInfo, SnapshotManifest
from mindspeed_rl.weights.megatron_dims import ShardCoords, load_dims
from mindspeed_rl.weights.merge import apply_name_map, merge_pieces, split_for_rank
from mindspeed_rl.weights.shardio import write_shard
from mindspeed_rl.weights.store import latest_published
from mindspeed_rl.weights.streaming_merge import _run_bounded, conversion_steps, plan_conversion
from mindspeed_rl.workers.megatron_engines import layout_rank

TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())


def _slice(layout: TrainingLayout, full: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    coords = layout.coords(rank)
    out = {}
    for name, tensor in full.items():
        spec = layout.spec_for(name)
        if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) // 2 != coords.ep_rank:
            continue  # per-expert names live on their EP rank only (experts 0-1 on EP 0, 2-3 on EP 1)
        if spec.ep_dim is not None:
            tensor = tensor.chunk(layout.ep_size, dim=spec.ep_dim)[coords.ep_rank]
        if spec.tp_dim is not None:
            tensor = tensor.chunk(layout.tp_size, dim=spec.tp_dim)[coords.tp_rank]
        out[name] = tensor.contiguous()
    return out


def _export(root: Path, layout: TrainingLayout, full: dict[str, torch.Tensor]) -> SnapshotInfo:
    writer = SnapshotWriter(root, run_id="run")
    for rank in range(layout.world_size):
        writer.export(1, _slice(layout, full, rank).items(), layout, rank=rank)
    writer.close()
    info = latest_published(root)
    assert info is not None
    return info


def _moe() -> tuple[TrainingLayout, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    stacked = PartitionRule(pattern=r"grouped_experts\.fc1$", spec=PartitionSpec(ep_dim=0, tp_dim=1))
    full = {
        f"model.layers.0.mlp.experts.{e}.gate_proj.weight": torch.randn(4, 6, generator=gen) for e in range(4)
    }
    full |= {
        f"model.layers.0.mlp.experts.{e}.down_proj.weight": torch.randn(6, 4, generator=gen) for e in range(4)
    }
    full["model.layers.0.mlp.grouped_experts.fc1"] = torch.randn(4, 8, 6, generator=gen)
    full["model.layers.0.mlp.gate.weight"] = torch.randn(4, 6, generator=gen)
    return TrainingLayout(tp_size=2, ep_size=2, rules=(stacked, *hf_dense_rules())), full


def _megatron(root: Path, family: str, tp: int, ep: int) -> SnapshotInfo:
    model = build_parity_model(root / "hf", family)
    dims, source = load_dims(model), DictSource(load_file(str(model / "model.safetensors")))
    layout = megatron_rules.training_layout(tp_size=tp, pp_size=1, ep_size=ep, dims=dims)
    for e in range(ep):
        for t in range(tp):
            coords = ShardCoords(tp_rank=t, tp_size=tp, ep_rank=e, ep_size=ep)
            state = {n: megatron_shard(n, dims, coords, source) for n in megatron_names(dims, coords)}
            writer = SnapshotWriter(root / "export", run_id="run")
            writer.export(1, export_shard(state, dims, coords).items(), layout, layout_rank(coords)).result()
            writer.close()
    info = latest_published(root / "export")
    assert info is not None
    return info


def _whole_model_reference(snapshot: SnapshotInfo, layout: InferenceLayout, out: Path) -> SnapshotManifest:
    manifest, pieces = read_training_pieces(snapshot)
    training = manifest.training_layout()
    names, finalize = conversion_steps(training, None)
    full = merge_pieces(apply_name_map(pieces, names), tp_size=training.tp_size, ep_size=training.ep_size)
    if finalize is not None:
        full = finalize(full)
    out.mkdir(parents=True)
    entries = []
    for rank in range(layout.world_size):
        tensors = split_for_rank(full, layout, rank)
        specs = {name: layout.spec_for(name) for name in tensors}
        entries.extend(write_shard(out / f"rank-{rank:05d}.safetensors", tensors, specs)[1])
    return SnapshotManifest(
        version=1, created_unix=0.0, kind="inference", layout={}, shards=(), tensors=tuple(entries)
    )


DENSE_TP2 = InferenceLayout(tp_size=2, rules=hf_dense_rules())


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("tiny_tp2", "tp1"),
        ("tiny_tp2", "tp2"),
        ("moe_ep2_tp2", "tp1"),
        ("moe_ep2_tp2", "ep2_tp2"),
        ("megatron_qwen3_tp2", "tp1"),
        ("megatron_qwen3_tp2", "tp2"),
        ("megatron_qwen3_moe_ep2", "ep2"),
    ],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_streaming_merge_writes_the_whole_model_merge_byte_for_byte(
    tmp_path: Path, tiny_model: dict[str, torch.Tensor], source: str, target: str, threads: int
) -> None:
    rules = hf_dense_rules()
    if source == "tiny_tp2":
        snapshot = _export(tmp_path / "export", TP2, tiny_model)
    elif source == "moe_ep2_tp2":
        training, full = _moe()
        snapshot, rules = _export(tmp_path / "export", training, full), training.rules
    elif source == "megatron_qwen3_tp2":  # fused QKV and fc1 unfused per TP piece, vocab padding trimmed
        snapshot = _megatron(tmp_path, "qwen3", tp=2, ep=1)
    else:
        snapshot = _megatron(tmp_path, "qwen3_moe", tp=1, ep=2)
    layout = {
        "tp1": InferenceLayout(),
        "tp2": DENSE_TP2,
        "ep2": InferenceLayout(ep_size=2, rules=rules),
        "ep2_tp2": InferenceLayout(tp_size=2, ep_size=2, rules=rules),
    }[target]
    result = GuConverter(tmp_path / "gu", layout, num_threads=threads).convert(snapshot)
    assert result.method == "merged"
    reference = _whole_model_reference(snapshot, layout, tmp_path / "reference")
    files = sorted(p.name for p in result.converted.path.glob("*.safetensors"))
    assert files == sorted(p.name for p in (tmp_path / "reference").iterdir())
    assert len(files) == layout.world_size
    for name in files:
        assert (result.converted.path / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), (
            name
        )
    written = json.loads((result.converted.path / MANIFEST_NAME).read_text())["tensors"]
    assert written == [e.to_json() for e in reference.tensors]


def test_plan_checks_the_whole_conversion_before_reading_a_byte(
    tmp_path: Path, tiny_model: dict[str, torch.Tensor]
) -> None:
    info = _export(tmp_path / "export", TP2, tiny_model)
    manifest = SnapshotManifest.load(info.path)
    for shard in manifest.shards:
        (info.path / shard.file).write_bytes(b"")  # any read would fail: the plan reads no file
    plan = plan_conversion(manifest, DENSE_TP2)
    rank0 = plan.per_rank[0]
    assert all(t.is_meta for t in rank0.values())
    assert rank0["model.layers.0.self_attn.o_proj.weight"].shape == (8, 4)
    assert rank0["model.norm.weight"].shape == (8,)
    with pytest.raises(ValueError, match="does not divide into 3 inference ranks"):
        plan_conversion(manifest, InferenceLayout(tp_size=3, rules=hf_dense_rules()))


def test_a_defect_found_midway_publishes_nothing_and_leaves_no_temp_folder(
    tmp_path: Path, tiny_model: dict[str, torch.Tensor]
) -> None:
    info = _export(tmp_path / "export", TP2, tiny_model)
    shard = info.path / "rank-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # rank 1's last tensor: the converter has written rank 0's groups by then
    shard.write_bytes(bytes(data))
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), num_threads=1)
    with pytest.raises(SnapshotError, match="checksum"):
        converter.convert(info)
    assert converter.latest() is None
    assert [p.name for p in (tmp_path / "gu").iterdir() if p.name != ".leases"] == []


def test_groups_in_flight_stay_within_the_largest_group() -> None:
    costs = [10, 4, 4, 4, 10, 3, 3, 3, 3]
    lock = threading.Lock()
    running: list[int] = []
    seen: list[list[int]] = []

    def work(cost: int) -> None:
        with lock:
            running.append(cost)
            seen.append(list(running))
        time.sleep(0.05)
        with lock:
            running.remove(cost)

    _run_bounded(costs, costs, work, num_threads=3)
    assert len(seen) == len(costs)
    assert max(sum(r) for r in seen) <= 10, seen
    assert max(len(r) for r in seen) >= 2, "small groups convert side by side"


def test_a_failing_group_stops_the_conversion() -> None:
    done: list[int] = []

    def work(item: int) -> None:
        if item == 2:
            raise SnapshotError("group 2 is corrupted")
        time.sleep(0.01)
        done.append(item)

    with pytest.raises(SnapshotError, match="group 2"):
        _run_bounded(list(range(40)), [1] * 40, work, num_threads=2)
    assert len(done) < 40


def test_a_later_version_of_the_same_structure_reuses_its_plan_and_still_checks_its_bytes(
    tmp_path: Path, model_factory
) -> None:
    """Refreshes share one plan (names, shapes, partitions); the bytes, their checksums and the
    version come from each snapshot's own manifest."""
    writer = SnapshotWriter(tmp_path / "export", keep_last=3, run_id="run")
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), num_threads=1)
    models = {v: model_factory(v) for v in (1, 2, 3)}
    plans = []
    for version, full in models.items():
        for rank in range(2):
            writer.export(version, _slice(TP2, full, rank).items(), TP2, rank=rank)
        writer.wait()
        info = latest_published(tmp_path / "export")
        assert info is not None and info.version == version
        manifest = SnapshotManifest.load(info.path)
        plans.append(plan_conversion(manifest, InferenceLayout()))
        assert plans[-1].manifest is manifest
        if version == 3:  # flip one byte: the cached plan must still catch it
            shard = info.path / "rank-00001.safetensors"
            data = bytearray(shard.read_bytes())
            data[-1] ^= 0x01
            shard.write_bytes(bytes(data))
            with pytest.raises(SnapshotError, match="checksum"):
                converter.convert(info)
            continue
        converted = load_file(converter.convert(info).converted.path / "rank-00000.safetensors")
        assert converted.keys() == full.keys()
        for name, tensor in full.items():
            assert torch.equal(converted[name], tensor), (version, name)
    writer.close()
    assert plans[1].groups is plans[0].groups and plans[2].groups is plans[0].groups
    other = {name: t for name, t in models[1].items() if name != "model.norm.weight"}
    writer = SnapshotWriter(tmp_path / "other", run_id="run")
    for rank in range(2):
        writer.export(1, _slice(TP2, other, rank).items(), TP2, rank=rank)
    writer.close()
    info = latest_published(tmp_path / "other")
    assert info is not None
    assert plan_conversion(SnapshotManifest.load(info.path), InferenceLayout()).groups is not plans[0].groups
