"""The colocated offload with megatron-core's real optimizers (issue 39, defect 1).

On an accelerator the megatron engine's optimizer is what ``get_megatron_optimizer`` returns, always
a ``ChainedOptimizer`` (megatron-core 0.12.1 and 0.19.2) around ``Float16OptimizerWithFloat16Params``
/ ``DistributedOptimizer`` / ``FP32Optimizer``, none of which is a ``torch.optim.Optimizer``. Here
they are megatron's own classes, built on the CPU through the engine's shims
(``tests/support/megatron_on_cpu.py`` says what it stands in for), without a process group; the
engine-level cycle over gloo, with ``get_megatron_optimizer`` itself, is in
``tests/mindspeed_rl/models/training/megatron/test_megatron_offload.py``.

On a CPU host a move to "cpu" changes nothing, so a tensor left behind would not show: one test
moves to float64 instead, through the same setters.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core.optimizer")

from megatron.core.optimizer import ChainedOptimizer, OptimizerConfig
from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer

from mindspeed_rl.workers.colocation import (
    move_train_state,
    offload_train_state,
    onload_train_state,
    train_state_tensors,
)
from tests.support.megatron_on_cpu import CudaTypeNames

ALL_PARTS = ("param", "grad", "optimizer")


def _init_state(optimizer: torch.optim.Optimizer, config: Any = None) -> None:
    """megatron's Adam ``init_state_fn`` (0.12.1 and 0.19.2 optimizer/__init__.py)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if len(optimizer.state[p]) == 0:
                optimizer.state[p]["exp_avg"] = torch.zeros_like(p.data)
                optimizer.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


class _Model(torch.nn.Module):
    """A bf16 part and an fp32 part, as megatron splits a model over its chained optimizers."""

    def __init__(self) -> None:
        super().__init__()
        self.bf16_part = torch.nn.Linear(4, 3).to(torch.bfloat16)
        self.fp32_part = torch.nn.Linear(3, 2)


def _chained(model: _Model) -> ChainedOptimizer:
    """What ``get_megatron_optimizer`` chains for such a model, stepped once (Adam moments and
    torch's scalar ``step`` exist), with gradients left on the masters as after a step."""
    config = OptimizerConfig(bf16=True, lr=0.1)
    with CudaTypeNames():
        half = Float16OptimizerWithFloat16Params(
            torch.optim.AdamW(model.bf16_part.parameters(), lr=0.1), config, None, _init_state
        )
        full = FP32Optimizer(torch.optim.AdamW(model.fp32_part.parameters(), lr=0.1), config, _init_state)
    chained = ChainedOptimizer([half, full])
    gen = torch.Generator().manual_seed(0)
    for member in chained.chained_optimizers:
        for group in member.optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        member.optimizer.step()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return chained


def _masters(chained: ChainedOptimizer) -> list[torch.Tensor]:
    half = chained.chained_optimizers[0]
    return [p for group in half.fp32_from_float16_groups for p in group]


def _state(chained: ChainedOptimizer, *, scalar: bool) -> list[torch.Tensor]:
    return [
        value
        for member in chained.chained_optimizers
        for state in member.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and (value.dim() == 0) == scalar
    ]


def _memory(tensors: Any) -> set[int]:
    return {t.data_ptr() for t in tensors}


def test_an_empty_chained_optimizer_has_nothing_to_move() -> None:
    """The issue's reproduction: a rank with no trainable parameters gets ChainedOptimizer([])."""
    model = torch.nn.Linear(2, 2)
    assert train_state_tensors(model, ChainedOptimizer([]), ("optimizer", "grad")) == []
    params = train_state_tensors(model, ChainedOptimizer([]), ("param",))
    assert len(params) == 2 and _memory(params) == _memory(model.parameters())


def test_the_optimizer_part_is_every_master_and_every_moment_of_the_chain() -> None:
    model = _Model()
    chained = _chained(model)
    masters = _masters(chained)
    assert len(masters) == 2 and all(m.dtype == torch.float32 for m in masters)
    moments = _state(chained, scalar=False)
    assert len(moments) == 2 * 4  # exp_avg, exp_avg_sq of 2 masters + 2 fp32 parameters
    chosen = train_state_tensors(model, chained, ("optimizer",))
    assert len(chosen) == len(masters) + len(moments)
    assert _memory(chosen) == _memory([*masters, *moments])
    # The fp32 part's parameters are the model's own: "param", not "optimizer".
    assert not _memory(model.fp32_part.parameters()) & _memory(chosen)


def test_the_optimizer_part_of_the_chain_moves_in_place() -> None:
    model = _Model()
    chained = _chained(model)
    half = chained.chained_optimizers[0]
    masters = _masters(chained)
    params = [p.data_ptr() for p in model.parameters()]
    # No second device on this host (and a parameter's data cannot be set to a "meta" tensor):
    # a move to float64 goes through the same setters and shows which tensors took it.
    move_train_state(model, chained, ("optimizer",), torch.float64)
    assert all(m.dtype == torch.float64 for m in masters)
    assert all(v.dtype == torch.float64 for v in _state(chained, scalar=False))
    # torch keeps a non-capturable Adam's step on the host; the scalars stay as they are.
    steps = _state(chained, scalar=True)
    assert steps and all(s.dtype == torch.float32 and s.device.type == "cpu" for s in steps)
    assert [p.data_ptr() for p in model.parameters()] == params  # the model's: not this part
    # Moved in place: megatron's own references still reach the moved tensors.
    assert [p for g in half.optimizer.param_groups for p in g["params"]] == masters
    assert all(p.main_param is m for p, m in zip(model.bf16_part.parameters(), masters, strict=True))


def test_the_grad_part_is_every_gradient_of_the_model_and_the_masters() -> None:
    model = _Model()
    chained = _chained(model)
    grads = [p.grad for p in model.parameters()] + [m.grad for m in _masters(chained)]
    chosen = train_state_tensors(model, chained, ("grad",))
    assert len(chosen) == len(grads) and _memory(chosen) == _memory(grads)


def test_an_offload_onload_cycle_keeps_the_chain_bit_exact_and_stepping() -> None:
    model, twin = _Model(), _Model()
    twin.load_state_dict(model.state_dict())
    chained, twin_chained = _chained(model), _chained(twin)
    before = [t.clone() for t in _masters(chained) + _state(chained, scalar=False)]
    offload_train_state(model, chained, ALL_PARTS)
    onload_train_state(model, chained, ALL_PARTS, "cpu")
    after = _masters(chained) + _state(chained, scalar=False)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    for c in (chained, twin_chained):
        for member in c.chained_optimizers:
            member.optimizer.step()
    for a, b in zip(_masters(chained) + _state(chained, scalar=False),
                    _masters(twin_chained) + _state(twin_chained, scalar=False), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=0)
