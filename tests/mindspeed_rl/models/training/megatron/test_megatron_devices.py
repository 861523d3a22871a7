"""Device discipline of the megatron engine: every tensor of a step on the engine's device.

This host has no accelerator, so the check runs the engine with ``device="cuda"`` on CPU tensors
under :class:`DeviceLedger`, a torch-function mode that gives every tensor a *virtual* device:

- "dev": the model's parameters, buffers, gradient buffers and optimizer state, and whatever is
  created for the engine's device (``device="cuda"`` or an int, ``.cuda()``, ``.to("cuda")``,
  ``device=t.device`` of a dev tensor, which reads as ``cuda:0``);
- "host": whatever is created without a device or for the CPU (``torch.tensor(...)``,
  ``torch.zeros(...)``, ``.cpu()``), as torch would place it on a real GPU host;
- results inherit their inputs' virtual device (dev wins: CUDA accepts 0-dim CPU operands).

It records, as CUDA would refuse them, ops that mix dev tensors with host tensors that are not
0-dim scalars (or write a dev result into a host tensor), ``.numpy()`` of a dev tensor, tensor
collectives on the NCCL group (every group but the engine's host group) given host tensors, and
Python-object collectives anywhere but the host group. And, as HCCL would refuse them on an
Ascend A2/A3 host, device collectives of a dtype that HCCL's op lacks (a float64 all-reduce, say),
per the table ``exact_collectives.HCCL_DTYPES`` records from CANN 8.5's HCCL reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

DEV, HOST = "dev", "host"
_ATTR = "_ledger_device"
_FAKE = torch.device("cuda", 0)
_DEVICE_GET = torch.Tensor.device.__get__
_IS_CUDA_GET = torch.Tensor.is_cuda.__get__
_TRANSFERS = {"to", "cuda", "cpu", "copy_", "clone", "detach", "detach_", "requires_grad_", "__setitem__"}


_IN_PLACE_DUNDERS = {
    f"__i{op}__"
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
        "matmul",
    )
}


def _in_place(name: str) -> bool:
    return (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_DUNDERS


def tag(tensor: torch.Tensor, where: str) -> None:
    setattr(tensor, _ATTR, where)


def where(obj: object) -> str | None:
    return getattr(obj, _ATTR, None) if isinstance(obj, torch.Tensor) else None


def _is_dev_device(device: object) -> bool:
    if isinstance(device, int):
        return True  # a CUDA ordinal
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _is_device(obj: object) -> bool:
    return isinstance(obj, (torch.device, int)) or (
        isinstance(obj, str) and obj.split(":")[0] in ("cuda", "cpu")
    )


def _caller() -> str:
    """The innermost three frames outside torch and this file, innermost first."""
    here = Path(__file__).name
    frames = [
        f for f in traceback.extract_stack() if "/torch/" not in f.filename and Path(f.filename).name != here
    ]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-3:]))


class DeviceLedger(TorchFunctionMode):
    """See the module docstring. ``violations``: what a real accelerator would refuse."""

    def __init__(self, host_group: Any) -> None:
        super().__init__()
        self.host_group = host_group
        self.violations: list[str] = []
        self.dev_ops = 0
        self.dev_collectives = 0
        self.host_object_collectives = 0

    def flag(self, what: str) -> None:
        self.violations.append(f"{what}  [{_caller()}]")

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func == _DEVICE_GET:
            return _FAKE if where(args[0]) == DEV else func(*args, **kwargs)
        if func == _IS_CUDA_GET:
            return where(args[0]) == DEV or func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        places = {where(t) for t in tensors} - {None}
        if name == "numpy" and DEV in places:
            self.flag("numpy() of a dev tensor")
        target = self._target(name, args, kwargs)
        if target is not None:
            kwargs["device"] = torch.device("cpu")
            if name == "to":
                args = tuple(a for a in args if not _is_device(a))
        out = func(*args, **kwargs)
        if target is None and name not in _TRANSFERS and DEV in places:
            self.dev_ops += 1
            self._check_mix(name, tensors)
        self._tag_result(name, args, out, target, places)
        return out

    def _target(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The virtual device an op explicitly creates on or moves to, if it names one."""
        device = kwargs.get("device")
        if device is None and name == "to":
            device = next((a for a in args[1:] if _is_device(a)), None)
        if device is None:
            return None
        return DEV if _is_dev_device(device) else HOST

    def _check_mix(self, name: str, tensors: list[torch.Tensor]) -> None:
        host = [t for t in tensors if where(t) == HOST]
        in_place = _in_place(name)
        if any(t.dim() > 0 for t in host):
            self.flag(
                f"{name} mixes dev tensors with host tensors of shapes {[tuple(t.shape) for t in host]}"
            )
        elif in_place and tensors and where(tensors[0]) == HOST:
            self.flag(f"{name} writes a dev result into a host tensor")

    def _tag_result(
        self, name: str, args: tuple[Any, ...], out: Any, target: str | None, places: set[str]
    ) -> None:
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not results:
            return
        if target is not None:
            place: str | None = target
        elif _in_place(name) or name == "__setitem__":
            return  # in place: the tensor keeps its device
        elif places:
            place = DEV if DEV in places else HOST
        elif not any(isinstance(a, torch.Tensor) for a in tree_flatten(args)[0]):
            place = HOST  # a factory without a device: torch's default device, the CPU
        else:
            return  # derived from tensors of unknown placement only
        for t in results:
            tag(t, place)


@contextlib.contextmanager
def _transfer_copies() -> Iterator[None]:
    """``.to``/``.cpu``/``.cuda`` on one CPU return the tensor itself; on a GPU host a transfer
    gives a new tensor. Force the copy so a tensor's virtual device never changes under it."""
    original_to, original_cpu, original_cuda = torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device", next((a for a in args if _is_device(a)), None))
        moves = device is not None and (where(self) == DEV) != _is_dev_device(device)
        return original_to(self, *args, **({**kwargs, "copy": True} if moves else kwargs))

    def moved(self: torch.Tensor, place: str) -> torch.Tensor:
        copy = self.clone()
        tag(copy, place)
        return copy

    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return moved(self, HOST) if where(self) == DEV else original_cpu(self, *args, **kwargs)

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if where(self) == DEV else moved(self, DEV)

    torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda = to, cpu, cuda  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda = original_to, original_cpu, original_cuda  # type: ignore[method-assign]


_TENSOR_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
    "send", "recv", "reduce", "_all_gather_base", "_reduce_scatter_base", "batch_isend_irecv",
)  # fmt: skip
"""Wrapped in place. Not isend / irecv: ``P2POp`` checks its op against the originals by identity
(megatron's p2p code goes through ``batch_isend_irecv``, which is wrapped)."""
_OBJECT_COLLECTIVES = (
    "all_gather_object", "gather_object", "broadcast_object_list", "send_object_list", "recv_object_list",
)  # fmt: skip


def _group(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _argument(fn, args, kwargs, "group")


def _argument(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    try:
        return inspect.signature(fn).bind(*args, **kwargs).arguments.get(name)
    except TypeError:
        return kwargs.get(name)


def check_tensor_collective(
    ledger: DeviceLedger, fname: str, tensors: list[torch.Tensor], *, on_host: bool, reduce_op: Any = None
) -> None:
    """What CUDA (host tensors on the device group) and HCCL (a dtype its op lacks) would refuse."""
    from mindspeed_rl.models.training.exact_collectives import hccl_refusal

    for t in tensors:
        if on_host and where(t) == DEV:
            ledger.flag(f"dist.{fname} of a dev tensor on the host group")
        elif not on_host and where(t) == HOST:
            ledger.flag(f"dist.{fname} of a host tensor {tuple(t.shape)} on the NCCL group")
        elif not on_host and where(t) == DEV:
            ledger.dev_collectives += 1
            refusal = hccl_refusal(fname, t.dtype, reduce_op=reduce_op)
            if refusal is not None:
                ledger.flag(f"dist.{fname} of a {t.dtype} dev tensor {tuple(t.shape)}: {refusal}")


@contextlib.contextmanager
def watched_collectives(ledger: DeviceLedger) -> Iterator[None]:
    """torch.distributed's collectives, checked by ``ledger`` before they run (gloo underneath)."""
    import torch.distributed as dist

    saved: dict[str, Any] = {}

    def tensor_call(fn: Callable[..., Any], fname: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if fname == "batch_isend_irecv":
                for op in args[0]:
                    # P2POp.op is dist.isend / dist.irecv: checked as HCCL's send / recv.
                    on_host = ledger.host_group is not None and op.group is ledger.host_group
                    check_tensor_collective(ledger, op.op.__name__, [op.tensor], on_host=on_host)
                return fn(*args, **kwargs)
            on_host = ledger.host_group is not None and _group(fn, args, kwargs) is ledger.host_group
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            reduce_op = _argument(fn, args, kwargs, "op")
            check_tensor_collective(ledger, fname, tensors, on_host=on_host, reduce_op=reduce_op)
            return fn(*args, **kwargs)

        return call

    def object_call(fn: Callable[..., Any], fname: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            group = _group(fn, args, kwargs)
            if group is None or group is not ledger.host_group:
                ledger.flag(f"dist.{fname} of Python objects outside the host group")
            else:
                ledger.host_object_collectives += 1
            return fn(*args, **kwargs)

        return call

    for fname in _TENSOR_COLLECTIVES + _OBJECT_COLLECTIVES:
        if hasattr(dist, fname):
            saved[fname] = getattr(dist, fname)
            wrap = tensor_call if fname in _TENSOR_COLLECTIVES else object_call
            setattr(dist, fname, wrap(saved[fname], fname))
    try:
        yield
    finally:
        for fname, fn in saved.items():
            setattr(dist, fname, fn)


def test_ledger_flags_what_cuda_would_refuse() -> None:
    weight = torch.nn.Parameter(torch.randn(4, 3))
    tag(weight, DEV)
    ledger = DeviceLedger(host_group=object())
    with _transfer_copies(), ledger:
        good = torch.ones(2, 4, device="cuda") @ weight  # created on the engine's device
        assert where(good) == DEV and good.device == _FAKE
        assert where(torch.zeros((), device=good.device) + good.sum()) == DEV  # device=t.device
        _ = good * torch.tensor(2.0)  # a 0-dim host scalar is fine on CUDA too
        host_result = good.detach().cpu()
        assert where(host_result) == HOST and where(good) == DEV
        host_result.numpy()
        assert ledger.violations == []
        _ = torch.ones(2, 4) @ weight  # host input into a dev weight
        acc = torch.zeros(())
        acc += good.sum()  # a dev value accumulated into a host scalar
        good.detach().numpy()
    assert len(ledger.violations) == 3, ledger.violations
    assert "mixes" in ledger.violations[0] and "host tensor" in ledger.violations[1]
    assert "numpy" in ledger.violations[2]


@contextlib.contextmanager
def _two_rank_stand_ins() -> Iterator[list[str]]:
    """torch.distributed's entry points as a 2-rank group would answer them, in this one process
    (no process group: the ledger checks the call, not the transport). ``all_gather`` hands back
    this rank's tensor as both ranks' rows; the list names the collectives called."""
    import torch.distributed as dist

    calls: list[str] = []

    def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        calls.append("all_reduce")

    def all_gather(
        tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> None:
        calls.append("all_gather")
        for row in tensor_list:
            row.copy_(tensor)

    saved = dist.all_reduce, dist.all_gather, dist.get_world_size
    dist.all_reduce, dist.all_gather = all_reduce, all_gather  # type: ignore[assignment]
    dist.get_world_size = lambda group=None: 2  # type: ignore[assignment]
    try:
        yield calls
    finally:
        dist.all_reduce, dist.all_gather, dist.get_world_size = saved  # type: ignore[assignment]


def test_the_hccl_rule_flags_what_hccl_lacks_on_the_device_group() -> None:
    """Float64 (and bf16 PRODUCT) reductions on the device group are flagged; float64 moves and
    the host (gloo) group are not."""
    import torch.distributed as dist

    host_group = object()
    ledger = DeviceLedger(host_group=host_group)
    with _two_rank_stand_ins(), watched_collectives(ledger), _transfer_copies(), ledger:
        sums = torch.zeros(5, dtype=torch.float64, device="cuda")
        dist.all_reduce(sums)  # what LossSums.all_reduce did before the fix
        assert len(ledger.violations) == 1 and "float64" in ledger.violations[0]
        assert "HCCL all_reduce" in ledger.violations[0], ledger.violations
        dist.all_reduce(sums.float())
        dist.all_gather([torch.empty_like(sums) for _ in range(2)], sums)  # a move: FP64 is fine
        dist.all_reduce(sums.cpu(), group=host_group)  # gloo reduces float64
        assert len(ledger.violations) == 1, ledger.violations
        dist.all_reduce(sums.bfloat16(), op=dist.ReduceOp.PRODUCT)
    assert len(ledger.violations) == 2 and "PRODUCT" in ledger.violations[1], ledger.violations


def test_loss_sums_reduce_exactly_through_a_collective_hccl_takes() -> None:
    """LossSums over a (stand-in) 2-rank device group: one all-gather of float64 rows the ledger
    accepts, sums and maxima exact in float64 (each rank's terms counted twice here)."""
    from mindspeed_rl.models.training.update_loop import LOSS_TERMS, LossSums

    ledger = DeviceLedger(host_group=object())
    with _two_rank_stand_ins() as calls, watched_collectives(ledger), _transfer_copies(), ledger:
        sums = LossSums("cuda", stats_size=(3, 2))
        terms = {name: torch.tensor([0.1 + i], dtype=torch.float32) for i, name in enumerate(LOSS_TERMS)}
        terms["correction_sums"] = torch.tensor([1e-9, 2.0, 3e8], dtype=torch.float64)
        terms["correction_max"] = torch.tensor([4.0, -1.0])
        sums.add(terms)
        expected = sums.totals()
        sums.all_reduce()
        totals = sums.totals()
    assert calls == ["all_gather"] and ledger.violations == [], ledger.violations
    for key, value in expected.items():
        assert totals[key] == (value if key.startswith("rc_max:") else 2 * value), key


HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)


def _batch(vocab_size: int) -> Any:
    from mindspeed_rl.models.training.batch import TrainBatch

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab_size, size=int(rng.integers(3, 9))) for _ in range(4)]
    responses = [rng.integers(0, vocab_size, size=int(rng.integers(2, 8))) for _ in range(4)]
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=4).astype(np.float32)
    )


def _tag_engine_state(engine: Any, reference: Any) -> None:
    """What lives on the device before a step: weights, buffers, gradient buffers, optimizer state."""
    for module in (engine.model, reference.model):
        for t in [*torch.nn.Module.parameters(module), *torch.nn.Module.buffers(module)]:
            tag(t, DEV)
        for sub in module.modules():
            for value in vars(sub).values():
                if isinstance(value, torch.Tensor):
                    tag(value, DEV)
    for buffer in [*engine.model.buffers, *engine.model.expert_parallel_buffers]:
        tag(buffer.grad_data, DEV)
    for p in engine.model.parameters():
        if getattr(p, "main_grad", None) is not None:
            tag(p.main_grad, DEV)
    for p in engine.optimizer.master_params or []:
        tag(p, DEV)


@contextlib.contextmanager
def _accelerator_runtime() -> Iterator[None]:
    """What a GPU host answers (the ledger maps "cuda" to CPU tensors): current device 0, nothing
    to synchronise; megatron's CPU shims (``patches.cpu_runtime_mode``) off, the ledger does their job."""
    from mindspeed_rl.models.training.megatron import patches

    saved = (
        torch.cuda.current_device,
        torch.cuda.synchronize,
        torch.cuda.current_stream,
        patches.cpu_runtime_mode,
    )
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_stream = patches._null_stream  # type: ignore[assignment]
    patches.cpu_runtime_mode = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        (
            torch.cuda.current_device,
            torch.cuda.synchronize,
            torch.cuda.current_stream,
            patches.cpu_runtime_mode,
        ) = saved  # type: ignore[assignment]


def _worker(rank: int, port: int, model_dir: str, layout_name: str, out: Any) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import LAYOUTS, init_gloo

    init_gloo(rank, 2, port)
    try:
        from mindspeed_rl.models.loss.config import GRPOLossConfig
        from mindspeed_rl.models.training.engine_config import TorchEngineConfig
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.groups import host_group
        from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel

        layout = LAYOUTS[layout_name]
        config = TorchEngineConfig(
            lr=1e-3, micro_batch_size=2, forward_micro_batch_size=3, mini_batch_size=4, n_samples_per_prompt=1,
            loss=GRPOLossConfig(init_kl_coef=0.05, entropy_coeff=0.01), device="cuda", param_dtype="bfloat16",
        )  # fmt: skip
        engine = MegatronTrainingEngine(model_dir, config, layout)
        reference = MegatronReferenceModel(
            model_dir, layout, micro_batch_size=2, device="cuda", param_dtype="bfloat16"
        )
        batch = _batch(engine.dims.vocab_size)
        _tag_engine_state(engine, reference)
        ledger = DeviceLedger(host_group())
        with _accelerator_runtime(), _transfer_copies(), watched_collectives(ledger), ledger:
            batch = batch.with_log_probs(ref=reference.compute_log_probs(batch, 0.7))
            batch = batch.with_log_probs(old=engine.compute_log_probs(batch, 0.7))
            metrics = engine.update(batch, 0.7)
        counts = (ledger.dev_ops, ledger.dev_collectives, ledger.host_object_collectives)
        out.put((rank, ledger.violations, counts, metrics["grad_norm"]))
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)")
@pytest.mark.parametrize(("family", "layout_name"), [("qwen3", "tp2"), ("qwen2", "pp2")])
def test_a_step_keeps_every_tensor_on_the_engine_device(
    tmp_path: Path, family: str, layout_name: str
) -> None:
    """Reference log-probs, policy log-probs and one update (bf16, KL and entropy on) at TP2, and
    at PP2 with tied embeddings (pipeline p2p, the embedding all-reduce over stages)."""
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    model_dir = build_parity_model(tmp_path / family, family, tied=family == "qwen2")
    out = ranks.context().SimpleQueue()
    ranks.start_ranks(_worker, (free_port(), str(model_dir), layout_name, out), 2)
    results = [out.get() for _ in range(2)]
    for rank, violations, (dev_ops, dev_collectives, host_objects), grad_norm in results:
        assert violations == [], f"rank {rank}:\n" + "\n".join(violations[:20])
        # The ledger saw the step (device ops, device collectives, objects over the host group); the
        # op count differs between megatron-core versions (0.12.1 runs ~1000 on a PP2 stage).
        assert dev_ops > 500 and dev_collectives > 0 and host_objects > 0, (rank, dev_ops, dev_collectives)
        assert np.isfinite(grad_norm) and grad_norm > 0


def test_the_torch_engine_keeps_a_step_on_its_device(tiny_model_path: Path) -> None:
    """The same ledger around the torch engine and its reference (one process, no collectives),
    built on CPU and then pointed at "cuda"; a bf16 run, so the fp32 masters are in the step."""
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig
    from mindspeed_rl.models.training.reference import ReferenceModel
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    config = TorchEngineConfig(
        lr=1e-3, micro_batch_size=2, mini_batch_size=4, n_samples_per_prompt=1,
        loss=GRPOLossConfig(init_kl_coef=0.05, entropy_coeff=0.01), param_dtype="bfloat16",
    )  # fmt: skip
    engine = TorchTrainingEngine(tiny_model_path, config)
    reference = ReferenceModel(tiny_model_path, micro_batch_size=2, param_dtype="bfloat16")
    for owner in (engine, reference):
        owner._device = torch.device("cuda")
    for t in [*engine.model.parameters(), *engine.model.buffers(), *reference._model.parameters()]:
        tag(t, DEV)
    for t in [*reference._model.buffers(), *(engine.optimizer.master_params or [])]:
        tag(t, DEV)
    batch = _batch(128)
    ledger = DeviceLedger(host_group=None)
    with _accelerator_runtime(), _transfer_copies(), ledger:
        batch = batch.with_log_probs(ref=reference.compute_log_probs(batch, 0.7))
        batch = batch.with_log_probs(old=engine.compute_log_probs(batch, 0.7))
        metrics = engine.update(batch, 0.7)
    assert ledger.violations == [], "\n".join(ledger.violations[:20])
    assert ledger.dev_ops > 500 and np.isfinite(metrics["grad_norm"])
