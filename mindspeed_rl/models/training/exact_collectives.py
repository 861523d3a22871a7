"""Float64-exact sums and maxima over a device group, through a collective every backend carries.

The loss-term sums and the gradient norm's partial sums are float64 so that a step's reported
terms do not depend on how its micro-batches were split across ranks (the parity tests compare
layouts term by term). NCCL reduces float64, but HCCL does not: CANN 8.5's HcclAllReduce /
HcclReduce / HcclReduceScatter take no FP64 on Atlas A2 or A3, and torch_npu 2.10.0.post4 refuses
a float64 ``all_reduce`` before it reaches HCCL (``ProcessGroupHCCL.cpp``: ``checkSupportedDataType``
in ``allreduce``, ``reduce``, ``reduce_scatter``). HcclAllGather does carry FP64 on both chips.

So each rank's float64 vector is all-gathered (data movement: bit-exact on any backend) and
every rank sums (or maxes) the ``[world, n]`` rows itself, in float64 on its host. That is as
exact as a float64 all-reduce (rounding only in the float64 sum) and every rank gets bit-identical
results, because each runs the same sum over the same gathered rows. The price is ``world x n``
float64 values gathered instead of ``n`` reduced: 5 loss terms plus the correction statistics
(tens of values) per rank, so some hundred kilobytes per optimizer step on a thousand ranks.

Float32 pairs with compensated (Kahan) sums were the other option; an all-reduce of the high
parts rounds in float32 at every hop, which the low parts do not capture, so they would not be
exact without a gather anyway.

:data:`HCCL_DTYPES` is the dtype table this relies on, per op and chip, as data: the device
discipline test (``test_megatron_devices.py``) checks every device collective of a step against it.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist

HCCL_REFERENCE = "CANN 8.5 HCCL API reference"
HCCL_SOURCE = (
    f"{HCCL_REFERENCE} (hcclapiref), dataType of HcclAllReduce (hcclcpp_07_0020), "
    "HcclBroadcast (0022), HcclAllGather (0023), HcclReduceScatter (0024), HcclReduce (0025), "
    "HcclSend (0030), HcclRecv (0032): rows 'Atlas A2 training/inference series' and 'Atlas A3 "
    "training/inference series'; the torch dtype -> HcclDataType map and the bool/uint8 -> int32 "
    "cast before reductions from torch_npu 2.10.0.post4 (commit 5dd8ef3f), ProcessGroupHCCL.cpp"
)
Chip = Literal["A2", "A3"]
CHIPS: tuple[Chip, ...] = ("A2", "A3")

# HCCL's reductions (sum, prod, max, min). bool and uint8 are accepted by torch_npu, which casts
# them to int32 before HcclAllReduce / HcclReduce (its allreduce pre-hook), so they appear here.
_REDUCTION = frozenset(
    {
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.bfloat16,
        torch.bool,
        torch.uint8,
    }
)
# HCCL's data movement; torch_npu sends bool as UINT8.
_MOVEMENT = frozenset(
    {
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.uint16,
        torch.int32,
        torch.uint32,
        torch.int64,
        torch.uint64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.bool,
    }
)
HCCL_DTYPES: dict[str, dict[Chip, frozenset[torch.dtype]]] = {
    "all_reduce": {"A2": _REDUCTION, "A3": _REDUCTION},
    "reduce": {"A2": _REDUCTION, "A3": _REDUCTION},
    "reduce_scatter": {"A2": _REDUCTION, "A3": _REDUCTION},
    "all_gather": {"A2": _MOVEMENT, "A3": _MOVEMENT},
    "broadcast": {"A2": _MOVEMENT, "A3": _MOVEMENT},
    "send": {"A2": _MOVEMENT, "A3": _MOVEMENT},
    "recv": {"A2": _MOVEMENT, "A3": _MOVEMENT},
}
"""Per HCCL op (named by the torch.distributed call family) and chip: the dtypes it takes."""
HCCL_PROD_EXCLUDED = frozenset({torch.int16, torch.bfloat16})
"""Same source: the "prod" reduction takes neither int16 nor bfp16 on A2 or A3."""

HCCL_OP_OF = {
    "all_reduce": "all_reduce",
    "reduce": "reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "broadcast": "broadcast",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
}
"""torch.distributed function -> the HCCL op it lands on."""


def hccl_refusal(function: str, dtype: torch.dtype, *, reduce_op: Any = None) -> str | None:
    """Why HCCL would refuse ``torch.distributed.<function>`` of a ``dtype`` tensor on some
    Atlas A2/A3 chip (``reduce_op``: the ReduceOp of a reduction), or None when every chip takes it."""
    op = HCCL_OP_OF.get(function)
    if op is None:
        return None
    missing = [chip for chip in CHIPS if dtype not in HCCL_DTYPES[op][chip]]
    if missing:
        return f"HCCL {op} has no {dtype} on Atlas {'/'.join(missing)} ({HCCL_REFERENCE})"
    if reduce_op == dist.ReduceOp.PRODUCT and dtype in HCCL_PROD_EXCLUDED:
        return f"HCCL {op} with PRODUCT has no {dtype} on Atlas A2/A3 ({HCCL_REFERENCE})"
    return None


def _gathered(values: torch.Tensor, group: Any) -> torch.Tensor:
    """``[world, n]`` on the host: every rank's ``values`` (1-D), in group rank order. Summed on
    the host because the callers read the result there next anyway (one copy per step), and so
    no float64 reduction kernel of the accelerator is relied on."""
    flat = values.reshape(-1).contiguous()
    world = dist.get_world_size(group)
    if world == 1:
        return flat.unsqueeze(0).cpu()
    rows = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(rows, flat, group=group)
    return torch.stack(rows).cpu()


def exact_sum(values: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The sum of ``values`` (float64, 1-D) over ``group``'s ranks, in float64 on every rank's host."""
    _check_float64(values)
    return _gathered(values, group).sum(dim=0)


def exact_sum_and_max(
    sums: torch.Tensor, maxes: torch.Tensor, group: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``exact_sum(sums)`` and the elementwise max of ``maxes`` over ``group`` (one gather; host tensors)."""
    _check_float64(sums)
    _check_float64(maxes)
    rows = _gathered(torch.cat([sums.reshape(-1), maxes.reshape(-1)]), group)
    head = sums.numel()
    out_max = rows[:, head:].amax(dim=0) if maxes.numel() else rows[0, head:].clone()
    return rows[:, :head].sum(dim=0), out_max


def _check_float64(values: torch.Tensor) -> None:
    if values.dtype != torch.float64:
        raise TypeError(f"exact reductions take float64 values, got {values.dtype}")
