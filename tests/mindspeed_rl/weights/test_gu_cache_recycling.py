"""A GU cache that writes its files (a merge, a delta's applied copy) writes each new version
over a retired version's file (``store.SpareFiles``) and may checksum with xxh3_64
(``GuConverter(checksum_algo=...)``): every version still loads bit for bit, nothing of the old
bytes survives, a file another name still points to is never written, and a flipped byte is
caught by the manifest's own algorithm."""

from __future__ import annotations

import os

import pytest
import torch
from test_gu_cache_volatile import _export  # a TU export of one version, every rank

from mindspeed_rl.weights import shardio, store
from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.delta import DeltaEncoder, DeltaReceiver
from mindspeed_rl.weights.delta_fs import applied_snapshot
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.manifest import MANIFEST_NAME, SnapshotError, SnapshotInfo, SnapshotManifest
from mindspeed_rl.weights.reload import ReloadPolicy


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def _load(info: SnapshotInfo) -> dict[str, torch.Tensor]:
    engine: dict[str, torch.Tensor] = {}
    result = ReloadPolicy(0).maybe_reload(info, lambda named: engine.update(dict(named)))
    assert result.status == "loaded", result
    return engine


@pytest.mark.parametrize("algo", ["crc32", "xxh3_64"])
def test_merges_write_over_retired_files_and_every_version_loads_exact(tmp_path, model_factory, algo):
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    converter = GuConverter(
        tmp_path / "gu", InferenceLayout(), keep_last=2, durable=False, checksum_algo=algo
    )
    inodes: dict[int, int] = {}
    for version in range(1, 8):
        model = model_factory(version)
        result = converter.convert(_export(tmp_path / "trainer", model, layout, version))
        assert result.method == "merged"
        file = result.converted.path / "rank-00000.safetensors"
        inodes[version] = os.stat(file).st_ino
        assert SnapshotManifest.load(result.converted.path).checksum_algo == algo
        loaded = _load(result.converted)
        for name, tensor in model.items():
            assert _same_bits(loaded[name], tensor), (version, name)
        assert len(converter.spare.files()) <= 1
    # v1 and v2 are new files; from v4 on (v1 retired after v3) each version reuses a retired one.
    assert inodes[4] == inodes[1] and inodes[5] == inodes[2] and inodes[7] == inodes[4]
    assert len(set(inodes.values())) == 3


def test_a_cache_of_hard_links_keeps_no_spare_files(tmp_path, tiny_model):
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), keep_last=1, durable=False)
    for version in range(1, 5):
        assert converter.convert(
            _export(tmp_path / "trainer", tiny_model, TrainingLayout(), version)
        ).method == ("linked")
    assert converter.spare.files() == [] and not (tmp_path / "gu" / store.SPARE_DIR).exists()


def test_the_pool_keeps_only_unshared_regular_files_up_to_its_size(tmp_path):
    pool = store.SpareFiles(tmp_path, max_files=2)
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"x" * 10)
    os.link(shared, tmp_path / "other-name.bin")
    assert not pool.keep(shared), "a file another name points to is never written over"
    assert shared.exists()
    files = []
    for size in (100, 10, 50):
        f = tmp_path / f"f{size}.bin"
        f.write_bytes(b"y" * size)
        files.append(f)
    assert pool.keep(files[0]) and pool.keep(files[1])
    assert not pool.keep(files[2]) and files[2].exists(), "the pool is full: the caller deletes it"
    target = tmp_path / "target.bin"
    assert pool.take(target, 12) and target.stat().st_size == 10, "the closest size first"
    assert pool.take(tmp_path / "t2.bin", 12) and not pool.take(tmp_path / "t3.bin", 12)


@pytest.mark.parametrize("old_size", [0, 37, 10_000_000])
def test_an_overwritten_file_is_byte_for_byte_a_fresh_one(tmp_path, tiny_model, old_size):
    specs = dict.fromkeys(tiny_model, hf_dense_rules()[0].spec)
    fresh = tmp_path / "fresh.safetensors"
    shardio.write_shard(fresh, tiny_model, specs)
    reused = tmp_path / "reused.safetensors"
    reused.write_bytes(os.urandom(min(old_size, 4096)) * max(1, old_size // 4096) if old_size else b"")
    shard = shardio.PlannedShard(reused, tiny_model, specs, overwrite=True)
    for name, tensor in tiny_model.items():
        shard.write(name, tensor)
    shard.finish(durable=False)
    assert reused.read_bytes() == fresh.read_bytes()


def test_an_xxh3_cache_catches_a_flipped_byte(tmp_path, tiny_model):
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), durable=False, checksum_algo="xxh3_64")
    converted = converter.convert(_export(tmp_path / "trainer", tiny_model, layout, 1)).converted
    manifest = SnapshotManifest.load(converted.path)
    assert {len(t.checksum) for t in manifest.tensors} == {16}
    file = converted.path / "rank-00000.safetensors"
    data = bytearray(file.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor's bytes
    file.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="checksum .* != manifest"):
        shardio.verify_shard(converted.path, manifest, manifest.shards[0])


def test_a_manifest_naming_an_unknown_checksum_is_refused(tmp_path, tiny_model):
    info = _export(tmp_path / "trainer", tiny_model, TrainingLayout(), 1)
    path = info.path / MANIFEST_NAME
    path.write_text(path.read_text().replace('"checksum_algo": "crc32"', '"checksum_algo": "md5"'))
    with pytest.raises(SnapshotError, match="checksum_algo 'md5' is unknown"):
        SnapshotManifest.load(info.path)


@pytest.mark.parametrize(("algo", "passes"), [("xxh3_64", 0), ("crc32", 1)])
def test_an_applied_copy_hands_its_xxh3_to_an_xxh3_cache(tmp_path, tiny_model, monkeypatch, algo, passes):
    """The delta checked every tensor with xxh3_64 when applying it: a cache of that algorithm
    records those checksums (no pass over the bytes); a CRC-32 cache takes its own while writing."""
    receiver = DeltaReceiver()
    receiver.apply(DeltaEncoder("on").encode(1, tiny_model.items(), None))
    applied = applied_snapshot(1, TrainingLayout(), "run", {0: receiver})
    assert applied.manifest.checksum_algo == "xxh3_64"
    hashed: list[int] = []
    real_crc, real_xxh3 = shardio._crc_update, shardio._xxh3_update
    monkeypatch.setattr(shardio, "_crc_update", lambda c, s: hashed.append(len(c)) or real_crc(c, s))
    monkeypatch.setattr(shardio, "_xxh3_update", lambda c, s: hashed.append(len(c)) or real_xxh3(c, s))
    converter = GuConverter(tmp_path / "gu", InferenceLayout(), durable=False, checksum_algo=algo)
    result = converter.convert_tensors(applied.manifest, applied.tensors)
    size = sum(t.numel() * t.element_size() for t in tiny_model.values())
    assert sum(hashed) == passes * size
    assert SnapshotManifest.load(result.converted.path).checksum_algo == algo
    hashed.clear()
    loaded = _load(result.converted)
    assert sum(hashed) == size, "the reload verifies every byte with the manifest's algorithm"
    for name, tensor in tiny_model.items():
        assert _same_bits(loaded[name], tensor), name
