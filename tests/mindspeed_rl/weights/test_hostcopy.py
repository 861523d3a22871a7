from __future__ import annotations

import pytest
import torch

from mindspeed_rl.weights.hostcopy import cat, copy_tensor, copy_tensors

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_are_bit_exact_independent_and_contiguous(dtype):
    source = (torch.randn(6, 10) * 4).to(dtype)
    strided = source[:, 2:7]  # not contiguous
    for original in (source, strided, source[1, 3]):
        copied = copy_tensor(original)
        assert copied.dtype == dtype and copied.shape == original.shape and copied.is_contiguous()
        assert torch.equal(copied.reshape(-1).view(torch.uint8), original.reshape(-1).view(torch.uint8))
    copied = copy_tensor(source)
    source.view(torch.uint8).fill_(0)
    assert copied.view(torch.uint8).any(), "the copy owns its memory"


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_matches_torch_cat_for_every_dtype(dim):
    for dtype in DTYPES:
        parts = [(torch.randn(3, 3) * 4).to(dtype) for _ in range(3)]
        expected = torch.cat([p.view(torch.uint8) for p in parts], dim=dim) if dim == 0 else None
        joined = cat(parts, dim)
        assert joined.dtype == dtype and joined.shape[dim] == 9
        if expected is not None:
            assert torch.equal(joined.view(torch.uint8), expected)
        for i, part in enumerate(parts):
            assert torch.equal(
                joined.narrow(dim, 3 * i, 3).contiguous().view(torch.uint8), part.view(torch.uint8)
            )


def test_parallel_copies_keep_order_and_errors_name_the_fix():
    tensors = [torch.full((n + 1,), float(n)) for n in range(7)]
    copies = copy_tensors(tensors, num_threads=3)
    assert [c.tolist() for c in copies] == [t.tolist() for t in tensors]
    with pytest.raises(ValueError, match="convert them first"):
        cat([torch.zeros(2), torch.zeros(2, dtype=torch.float16)], 0)


def test_an_arena_cuts_disjoint_pieces_and_grows_to_the_largest_round() -> None:
    from mindspeed_rl.weights.hostcopy import Arena

    arena = Arena()
    first = arena.take((3, 5), torch.float32)  # nothing reserved yet: fresh memory
    assert first.shape == (3, 5) and arena.nbytes == 0
    arena.reset()
    assert arena.nbytes == 64, "grown to the round's bytes (60, aligned)"
    a = arena.take((3, 5), torch.float32)
    b = arena.take((7,), torch.int64)  # past the buffer: fresh memory, counted for next time
    a.fill_(1.0)
    b.fill_(-3)
    assert bool((a == 1.0).all()) and bool((b == -3).all())
    arena.reset()
    assert arena.nbytes == 128
    c, d = arena.take((2,), torch.bfloat16), arena.take((7,), torch.int64)
    c.fill_(2.0)
    d.fill_(-4)
    assert d.data_ptr() == c.data_ptr() + 64, "aligned, right after c"
    assert torch.equal(c, torch.full((2,), 2.0, dtype=torch.bfloat16)) and bool((d == -4).all())
    arena.reset()
    e = arena.take((2,), torch.bfloat16)
    assert e.data_ptr() == c.data_ptr(), "a round that fits reuses the same pages"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_go_into_given_memory_where_it_is_given(dtype):
    sources = [(torch.randn(6, 10) * 4).to(dtype)[:, 2:7], (torch.randn(3) * 4).to(dtype)]
    target = torch.empty(6, 5, dtype=dtype)
    copies = copy_tensors(sources, into=[target, None], num_threads=2)
    assert copies[0] is target and copies[1].data_ptr() != sources[1].data_ptr()
    for copied, source in zip(copies, sources, strict=True):
        assert torch.equal(copied.reshape(-1).view(torch.uint8), source.reshape(-1).view(torch.uint8))


def test_memory_that_does_not_fit_is_refused():
    source = torch.randn(4, 6)
    with pytest.raises(ValueError, match="one per tensor"):
        copy_tensors([source], into=[])
    with pytest.raises(ValueError, match="cannot copy"):
        copy_tensors([source], into=[torch.empty(4, 6, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="cannot copy"):
        copy_tensors([source], into=[torch.empty(6, 4)])
    with pytest.raises(ValueError, match="strided"):
        copy_tensors([source], into=[torch.empty(6, 4).t()])
