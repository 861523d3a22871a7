"""The hybrid weight push's record: exact for every dtype, and free of torch's storage pickling."""

from __future__ import annotations

import pickle

import pytest
import torch

from mindspeed_rl.models.rollout.host_weights import HostWeights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_round_trip_is_exact(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    named = [
        ("a.weight", (torch.randn(3, 5, generator=g) * 7).to(dtype)),
        ("b.bias", torch.arange(4).to(dtype)),
    ]
    sent = pickle.loads(pickle.dumps(HostWeights.from_tensors(named)))
    got = dict(sent)
    assert list(got) == ["a.weight", "b.bias"] and len(sent) == 2
    for name, tensor in named:
        assert got[name].dtype == dtype
        assert torch.equal(got[name], tensor)


def test_pickles_no_tensor_storage() -> None:
    """A dict of tensors pickles through ``torch.storage._load_from_bytes`` (which megatron-core
    replaces with its own function); the record must not, so unpickling never imports megatron."""
    named = [("w", torch.ones(2, 2, dtype=torch.bfloat16))]
    assert b"_load_from_bytes" in pickle.dumps(dict(named))  # the failure mode is real
    payload = pickle.dumps(HostWeights.from_tensors(named))
    assert b"_load_from_bytes" not in payload and b"torch" not in payload


def test_tensors_from_read_only_arrays_are_writable_copies() -> None:
    weights = HostWeights.from_tensors([("w", torch.zeros(3))])
    for _, array in weights.arrays:
        array.flags.writeable = False  # as read from Ray's object store
    ((_, tensor),) = list(weights)
    tensor += 1  # an engine writing into what it was given must not touch shared memory
    assert float(weights.arrays[0][1].sum()) == 0.0
