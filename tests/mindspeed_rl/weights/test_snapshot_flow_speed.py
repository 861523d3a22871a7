"""The weight flow moves each byte as few times as it must: links for identity, CRC once per write."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mindspeed_rl.weights import shardio, store
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.manifest import MANIFEST_NAME, SnapshotError, SnapshotInfo
from mindspeed_rl.weights.merge import NameMap
from mindspeed_rl.weights.reload import ReloadPolicy

SHARD = "rank-00000.safetensors"


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _export(root: Path, version: int, tensors: dict[str, torch.Tensor], keep_last: int = 2) -> SnapshotInfo:
    writer = SnapshotWriter(root, keep_last=keep_last, run_id="run")
    info = writer.export(version, tensors.items(), TrainingLayout()).result().published
    writer.close()
    assert info is not None
    return info


def _loaded(info: SnapshotInfo | None) -> dict[str, torch.Tensor]:
    engine: dict[str, torch.Tensor] = {}
    result = ReloadPolicy(-1).maybe_reload(info, lambda named: engine.update(dict(named)))
    assert result.status == "loaded", result.reason
    return engine


def _assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype and torch.equal(actual[name], tensor), name


def test_identity_convert_hard_links_the_export_file(tmp_path, tiny_model):
    info = _export(tmp_path / "export", 1, tiny_model)
    result = GuConverter(tmp_path / "gu", InferenceLayout()).convert(info)
    assert result.method == "linked" and result.bytes_written == 0
    exported, cached = os.stat(info.path / SHARD), os.stat(result.converted.path / SHARD)
    assert (exported.st_dev, exported.st_ino) == (cached.st_dev, cached.st_ino)
    assert cached.st_nlink == 2
    _assert_same(_loaded(result.converted), tiny_model)


def test_linked_cache_survives_export_retention(tmp_path, model_factory):
    first = _export(tmp_path / "export", 1, model_factory(1), keep_last=1)
    converted = GuConverter(tmp_path / "gu", InferenceLayout(), keep_last=3).convert(first).converted
    writer = SnapshotWriter(tmp_path / "export", keep_last=1, run_id="run")
    assert writer.export(2, model_factory(2).items(), TrainingLayout()).result().pruned_versions == (1,)
    writer.close()
    assert not first.path.exists()
    assert os.stat(converted.path / SHARD).st_nlink == 1
    _assert_same(_loaded(converted), model_factory(1))


def test_identity_convert_copies_only_where_links_are_impossible(tmp_path, tiny_model, monkeypatch):
    info = _export(tmp_path / "export", 1, tiny_model)

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(store.os, "link", cross_device)
    result = GuConverter(tmp_path / "gu", InferenceLayout()).convert(info)
    assert result.method == "copied" and result.bytes_written == os.stat(info.path / SHARD).st_size
    assert os.stat(info.path / SHARD).st_ino != os.stat(result.converted.path / SHARD).st_ino
    _assert_same(_loaded(result.converted), tiny_model)


def test_link_failure_that_is_not_about_the_file_system_is_raised(tmp_path, tiny_model, monkeypatch):
    info = _export(tmp_path / "export", 1, tiny_model)

    def disk_error(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store.os, "link", disk_error)
    with pytest.raises(OSError, match="Input/output"):
        GuConverter(tmp_path / "gu", InferenceLayout()).convert(info)


def test_renaming_or_sharded_conversion_rewrites_instead_of_linking(tmp_path, tiny_model):
    info = _export(tmp_path / "export", 1, tiny_model)
    renamed = NameMap(rename=lambda name: name.replace("model.", "m.", 1))
    result = GuConverter(tmp_path / "gu", InferenceLayout(), name_map=renamed).convert(info)
    assert result.method == "merged"
    assert os.stat(info.path / SHARD).st_ino != os.stat(result.converted.path / SHARD).st_ino
    assert "m.norm.weight" in _loaded(result.converted)
    tp2 = GuConverter(tmp_path / "gu-tp2", InferenceLayout(tp_size=2, rules=hf_dense_rules())).convert(info)
    assert tp2.method == "merged"


def test_identity_convert_checks_the_header_against_the_manifest(tmp_path, tiny_model):
    info = _export(tmp_path / "export", 1, tiny_model)
    text = (info.path / MANIFEST_NAME).read_text()
    (info.path / MANIFEST_NAME).write_text(text.replace('"dtype": "bfloat16"', '"dtype": "float16"', 1))
    converter = GuConverter(tmp_path / "gu", InferenceLayout())
    with pytest.raises(SnapshotError, match="manifest says float16"):
        converter.convert(info)
    assert converter.latest() is None


class _CrcCounter:
    def __init__(self) -> None:
        self.bytes = 0
        self._real = shardio._crc_update

    def __call__(self, chunk: memoryview, crc: int) -> int:
        self.bytes += len(chunk)
        return self._real(chunk, crc)


def test_each_byte_is_checksummed_once_per_write_and_once_per_read(tmp_path, tiny_model, monkeypatch):
    counter = _CrcCounter()
    monkeypatch.setattr(shardio, "_crc_update", counter)
    size = _nbytes(tiny_model)

    info = _export(tmp_path / "export", 1, tiny_model)
    assert counter.bytes == size, "export: one CRC pass, taken while writing"
    counter.bytes = 0
    converted = GuConverter(tmp_path / "gu", InferenceLayout()).convert(info).converted
    assert counter.bytes == 0, "identity convert reads no tensor bytes"
    _loaded(converted)
    assert counter.bytes == size, "reload verifies every byte it reads, once"


def test_merge_convert_verifies_what_it_reads_and_checksums_what_it_writes(tmp_path, tiny_model, monkeypatch):
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    writer = SnapshotWriter(tmp_path / "export", run_id="run")
    for rank in range(2):
        shard = {
            n: (
                t.chunk(2, s.tp_dim)[rank].contiguous() if (s := layout.spec_for(n)).tp_dim is not None else t
            )
            for n, t in tiny_model.items()
        }
        writer.export(1, shard.items(), layout, rank=rank)
    writer.close()
    info = store.latest_published(tmp_path / "export")
    counter = _CrcCounter()
    monkeypatch.setattr(shardio, "_crc_update", counter)
    result = GuConverter(tmp_path / "gu", InferenceLayout()).convert(info)  # type: ignore[arg-type]
    exported = sum(e["nbytes"] for e in _manifest_tensors(info.path))  # type: ignore[union-attr]
    assert result.method == "merged"
    assert counter.bytes == exported + _nbytes(tiny_model)


def _manifest_tensors(path: Path) -> list[dict]:
    import json

    return json.loads((path / MANIFEST_NAME).read_text())["tensors"]


def test_shard_files_are_standard_safetensors_and_parallel_io_round_trips(tmp_path, model_factory):
    tensors = {f"layer.{i}.weight": torch.randn(64, 33) for i in range(9)} | model_factory(3)
    tensors["empty"] = torch.zeros(0, 4)
    specs = dict.fromkeys(tensors, hf_dense_rules()[0].spec)
    for threads in (1, 3):
        path = tmp_path / f"shard-{threads}.safetensors"
        size, entries = shardio.write_shard(path, tensors, specs, num_threads=threads)
        assert size == path.stat().st_size and len(entries) == len(tensors)
        _assert_same(load_file(str(path)), tensors)
