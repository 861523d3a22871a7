"""The delta codec's cheaper passes stay exact: the checksum each refresh names (xxh3_64, crc32
for wire forms packed before the field), and the encoder's base advanced in place at the changed
words when the caller's tensors are not the encoder's to keep (``owned=False``), on edge inputs:
NaN payloads, -0.0 against 0.0, every word changed, none changed, sizes that are no multiple of
anything, fp32 and bf16."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch
import xxhash
from safetensors.numpy import load, save

from mindspeed_rl.weights import delta_kernels
from mindspeed_rl.weights.delta import (
    CHECKSUM_ALGO,
    DeltaEncoder,
    DeltaMismatch,
    DeltaReceiver,
    DeltaRefresh,
    checksum,
    words,
)
from mindspeed_rl.weights.delta_kernels import scatter_words, sparse_words
from mindspeed_rl.weights.delta_wire import pack, unpack


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _wire(refresh: DeltaRefresh) -> DeltaRefresh:
    return unpack(pack(refresh))


def test_refreshes_name_their_checksum_and_it_is_xxh3_of_the_words() -> None:
    w = {"a": torch.randn(1000).bfloat16(), "b": torch.randn(7)}
    sent = _wire(DeltaEncoder("on").encode(1, w.items(), None))
    assert CHECKSUM_ALGO == "xxh3_64" and sent.checksum_algo == "xxh3_64"
    for part in sent.tensors:
        assert part.checksum == xxhash.xxh3_64_intdigest(words(w[part.name]).view(np.uint8).data)


def test_a_crc32_encoder_is_checked_with_crc32() -> None:
    encoder, receiver = DeltaEncoder("on", checksum_algo="crc32"), DeltaReceiver()
    w = {"a": torch.randn(300).bfloat16()}
    first = _wire(encoder.encode(1, w.items(), None))
    assert first.checksum_algo == "crc32"
    assert first.tensors[0].checksum == zlib.crc32(words(w["a"]).view(np.uint8).data)
    receiver.apply(first)
    w["a"][5] = 3.0
    receiver.apply(_wire(encoder.encode(2, w.items(), receiver.base_version)))
    assert torch.equal(_bits(receiver.tensors()["a"]), _bits(w["a"]))
    assert receiver.checksums()["a"][0] == "crc32"


def _without_algo(buffer: bytes) -> bytes:
    """The wire form as it was packed before refreshes named their checksum."""
    size = int.from_bytes(buffer[:8], "little")
    meta = json.loads(json.loads(buffer[8 : 8 + size])["__metadata__"]["delta"])
    del meta["checksum_algo"]
    return save(dict(load(buffer)), metadata={"delta": json.dumps(meta)})


def test_a_wire_form_without_the_field_reads_as_crc32() -> None:
    w = {"a": torch.randn(64)}
    old = DeltaEncoder("on", checksum_algo="crc32").encode(1, w.items(), None)
    back = unpack(_without_algo(pack(old)))
    assert back.checksum_algo == "crc32"
    DeltaReceiver().apply(back)  # checks crc32: passes
    new = DeltaEncoder("on").encode(1, w.items(), None)  # xxh3 values, read as crc32: refused
    with pytest.raises(DeltaMismatch, match="v1: tensor a does not match"):
        DeltaReceiver().apply(unpack(_without_algo(pack(new))))


def test_an_unknown_checksum_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown delta checksum 'md5'"):
        DeltaEncoder("on", checksum_algo="md5")  # type: ignore[arg-type]
    w = {"a": torch.randn(8)}
    buffer = pack(DeltaEncoder("on").encode(1, w.items(), None))
    size = int.from_bytes(buffer[:8], "little")
    meta = json.loads(json.loads(buffer[8 : 8 + size])["__metadata__"]["delta"])
    meta["checksum_algo"] = "sha9"
    with pytest.raises(ValueError, match="checksummed with 'sha9'"):
        unpack(save(dict(load(buffer)), metadata={"delta": json.dumps(meta)}))
    with pytest.raises(ValueError, match="unknown delta checksum"):
        checksum(np.zeros(4, np.uint16), "sha9")  # type: ignore[arg-type]


def _nan(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def _edge_versions(dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    """Versions whose words change in the ways a compare of values (not bits) would miss."""
    gen = torch.Generator().manual_seed(3)
    v1 = {
        "odd": torch.randn(65537, generator=gen).to(dtype),  # one word past an index block
        "one": torch.tensor([1.5]).to(dtype),
        "three": torch.tensor([0.0, 1.0, 2.0]).to(dtype),
        "signs": torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0]).to(dtype),
        "nans": torch.tensor([float("nan")] * 5 + [1.0]).to(dtype),
    }
    v2 = {k: t.clone() for k, t in v1.items()}
    v2["odd"][[0, 1, 65535, 65536]] += 1.0
    v2["three"] = -v2["three"]  # every word changes (0.0 -> -0.0 included)
    v2["signs"] = torch.tensor([-0.0, 0.0, 0.0, -0.0, 1.0]).to(dtype)  # equal values, other bits
    nan_words = v2["nans"].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
    nan_words[1] ^= 1  # another NaN payload
    nan_words[3] ^= 1 << 3
    v3 = {k: t.clone() for k, t in v2.items()}  # nothing changes at all
    v4 = {k: t.clone() for k, t in v3.items()}
    v4["odd"] = torch.randn(65537, generator=gen).to(dtype)  # (almost) every word changes
    v4["one"] = torch.tensor([_nan(0x7FC00001)]).to(dtype)
    return [v1, v2, v3, v4]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_base_advanced_in_place_holds_every_bit(dtype: torch.dtype) -> None:
    encoder, receiver = DeltaEncoder("on", full_interval=100), DeltaReceiver()
    live = {k: t.clone() for k, t in _edge_versions(dtype)[0].items()}  # the caller's tensors
    for version, target in enumerate(_edge_versions(dtype), start=1):
        for name, t in target.items():
            live[name].copy_(t)  # the trainer updates its tensors in place between versions
        sent = encoder.encode(version, live.items(), receiver.base_version)
        assert sent.is_full == (version == 1)
        before = _edge_versions(dtype)[max(version - 2, 0)]
        expect = sum(int((words(live[n]) != words(t)).sum()) for n, t in before.items())
        assert version == 1 or sent.changed_elements == expect, version
        receiver.apply(_wire(sent))
        for name, t in target.items():
            assert torch.equal(_bits(receiver.tensors()[name]), _bits(t)), (version, name)
    # The caller's tensors were never aliased: changing them in place is a change the next
    # delta carries, and the base is the last version's bits exactly (no change: empty delta).
    live["one"].fill_(7.0)
    sent = encoder.encode(5, live.items(), receiver.base_version)
    assert sent.changed_elements == 1
    receiver.apply(_wire(sent))
    assert torch.equal(_bits(receiver.tensors()["one"]), _bits(live["one"]))
    assert encoder.encode(6, live.items(), 5).changed_elements == 0


def test_owned_tensors_are_kept_as_the_base_without_a_copy() -> None:
    encoder = DeltaEncoder("on")
    first = {"a": torch.arange(10, dtype=torch.float32)}
    encoder.encode(1, first.items(), None, owned=True)
    second = {"a": first["a"].clone()}
    second["a"][3] = -1.0
    sent = encoder.encode(2, second.items(), 1, owned=True)
    assert sent.changed_elements == 1
    assert encoder._base["a"].ctypes.data == second["a"].data_ptr()  # a view of the owned copy


def test_the_base_an_owned_encode_lets_go_is_handed_over_once() -> None:
    encoder = DeltaEncoder("on")
    first = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(4, dtype=torch.bfloat16)}
    encoder.encode(1, first.items(), None, owned=True)
    assert encoder.take_spare(first.items()) == {}, "nothing let go yet"
    second = {name: t.clone() for name, t in first.items()}
    encoder.encode(2, second.items(), 1, owned=True)
    like = {"a": torch.empty(10), "b": torch.empty(5, dtype=torch.bfloat16)}  # b no longer fits
    spare = encoder.take_spare(like.items())
    assert list(spare) == ["a"] and spare["a"].data_ptr() == first["a"].data_ptr()
    assert spare["a"].dtype == torch.float32 and spare["a"].shape == (10,)
    assert encoder.take_spare(like.items()) == {}, "handed over once"
    encoder.encode(3, {"a": torch.zeros(10), "b": torch.ones(4, dtype=torch.bfloat16)}.items(), 2)
    assert encoder.take_spare(like.items()) == {}, "a base advanced in place is never let go"


def test_the_compiled_compare_compares_bits(kernels) -> None:
    old = np.array([0x0000, 0x8000, 0x7FC0, 0x7FC1, 5], dtype=np.uint16)  # -0.0, NaN payloads
    new = np.array([0x8000, 0x8000, 0x7FC1, 0x7FC1, 5], dtype=np.uint16)
    low, values, blocks = sparse_words(old, new, write_back=False)
    assert low.tolist() == [0, 2] and values.tolist() == [0x8000, 0x7FC1] and blocks.tolist() == [2]
    assert sparse_words(old, old.copy(), write_back=False)[1].size == 0


@pytest.fixture(params=["compiled", "numpy"])
def kernels(request, monkeypatch):
    """Both implementations: the compiled loops, and numpy's passes (where numba is missing)."""
    if request.param == "numpy":
        monkeypatch.setattr(delta_kernels, "_sparse_words", None)
        monkeypatch.setattr(delta_kernels, "_scatter_words", None)
    else:
        assert delta_kernels._sparse_words is not None, "numba is a core dependency"
    return request.param


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize(
    ("size", "fraction"),
    [(0, 0.5), (1, 1.0), (65_536, 0.02), (200_003, 0.017), (131_073, 0.0), (70_001, 1.0)],
)
def test_the_compiled_passes_match_numpy_on_any_size_and_density(
    kernels, dtype, size: int, fraction: float
) -> None:
    rng = np.random.default_rng(size)
    old = rng.integers(0, np.iinfo(dtype).max, size=size, dtype=dtype, endpoint=True)
    new = old.copy()
    flip = rng.random(size) < fraction
    new[flip] ^= dtype(1)
    idx = np.flatnonzero(old != new)  # the reference: numpy's passes the loop replaced
    base = old.copy()
    low, values, blocks = sparse_words(base, new, write_back=True)
    assert low.dtype == np.uint16 and values.dtype == new.dtype and blocks.dtype == np.uint32
    assert np.array_equal(low, (idx & 0xFFFF).astype(np.uint16)) and np.array_equal(values, new[idx])
    assert np.array_equal(blocks, np.bincount(idx >> 16, minlength=(size + 0xFFFF) >> 16))
    assert np.array_equal(base, new), "write_back advances the base to the new words"
    target = old.copy()
    scatter_words(target, low, values, blocks)
    assert np.array_equal(target, new)


def test_a_scatter_that_does_not_fit_is_refused_before_it_writes(kernels) -> None:
    flat = np.zeros(70_000, dtype=np.uint16)
    low, values, blocks = sparse_words(flat, np.ones(70_000, dtype=np.uint16), write_back=False)
    bad_low = low.copy()
    bad_low[-1] = 0xFFFF  # block 1 holds 70_000 - 65_536 words: index 131_071 is past the end
    with pytest.raises(ValueError, match="index 131071 of 70000 words"):
        scatter_words(flat, bad_low, values, blocks)
    with pytest.raises(ValueError, match="block counts summing"):
        scatter_words(flat, low, values[:-1], blocks)
    with pytest.raises(ValueError, match="blocks of uint32 for 70000 uint16"):
        scatter_words(flat, low, values.astype(np.uint32), blocks)
    assert not flat.any(), "nothing written"


def test_a_receiver_refuses_a_sparse_part_that_does_not_fit_before_changing_anything() -> None:
    encoder, receiver = DeltaEncoder("on"), DeltaReceiver()
    first = {"a": torch.arange(70_000, dtype=torch.bfloat16), "b": torch.ones(8)}
    receiver.apply(_wire(encoder.encode(1, first.items(), None)))
    second = {name: t.clone() for name, t in first.items()}
    second["a"][-1] = 5.0
    second["b"][0] = 2.0
    sent = _wire(encoder.encode(2, second.items(), 1))
    part = next(p for p in sent.tensors if p.name == "a")
    assert part.indices is not None
    part.indices[-1] = 0xFFFF  # block 1 of "a" holds 70_000 - 65_536 words
    held_b = receiver.tensors()["b"]  # a view of the receiver's copy
    with pytest.raises(DeltaMismatch, match=r"tensor a's sparse part is malformed \(index 131071 of 70000"):
        receiver.apply(sent)
    assert receiver.base_version is None, "the copy is dropped: the next refresh is full"
    assert torch.equal(held_b, first["b"]), "b's change was not scattered either: every part is checked first"
