"""The stages of ``benchmarks/device_check.py``, one function each, run one per process.

Each takes a :class:`StageContext` and returns its figures (JSON-able); a check that fails raises
:class:`StageFailed` carrying the figures measured so far. They import only what the device has
(torch, transformers, safetensors, numpy, megatron-core) and this repository's modules that need
nothing more: the trainer's engines, ``plan/memory.py``, ``workers/colocation.py``,
``weights/collective*.py``; never vLLM or Ray (the test runs them with both made unimportable).

On a CPU host the megatron engine steps a torch optimizer (``megatron/optimizer.py`` says why),
so the stages that name megatron's optimizer check it only on the GPU; every other check holds on
both.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gpu_smoke
from benchmarks.gpu_smoke import SmokeSettings
from mindspeed_rl.contracts import OffloadPart

GB = 1e9
ALL_PARTS: tuple[OffloadPart, ...] = ("param", "grad", "optimizer")
"""What the colocated hybrid's ``offload_train_*`` keys can move: every part."""


class StageFailed(RuntimeError):
    """A check of a stage failed; ``figures`` holds what was measured before it."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass(frozen=True, slots=True, kw_only=True)
class StageContext:
    device: str
    size: str
    work: Path
    shape: dict[str, Any]
    settings: SmokeSettings
    bucket_mb: float
    """The collective transport's bucket size (``weight_transport`` bucket_mb)."""

    @property
    def model_dir(self) -> Path:
        return self.work / "model"


def context(*, device: str, size: str, work: Path, dtype: str | None) -> StageContext:
    """The GPU sizes: gpu_smoke's (Qwen3-0.6B shape, 4 x 2048 tokens per step, 20 steps);
    tiny: gpu_smoke's dry-run model, a few short steps. bf16 on both, as the recipes train: on
    CPU too, so the fp32 masters, the fp32-gradient switch and their checkpointing are exercised."""
    tiny = size == "tiny"
    if device == "cpu":
        import torch

        torch.set_num_threads(2)  # a shared CPU host
    settings = SmokeSettings(
        steps=2 if tiny else 20, seq_length=32 if tiny else 2048, samples_per_step=2 if tiny else 4,
        micro_batch_size=1, param_dtype=dtype or "bfloat16", device=device,
    )  # fmt: skip
    shape = gpu_smoke.QWEN3_TINY if tiny else gpu_smoke.QWEN3_SMALL
    return StageContext(
        device=device, size=size, work=work, shape=shape, settings=settings, bucket_mb=0.02 if tiny else 256.0
    )


# ---- helpers ---------------------------------------------------------------------------------------
def _require_model(ctx: StageContext) -> Path:
    if not (ctx.model_dir / "config.json").exists():
        raise FileNotFoundError(f"{ctx.model_dir} holds no model; the model stage builds it (run it first)")
    return ctx.model_dir


def _sync(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()


def _allocated(device: str) -> int | None:
    import torch

    _sync(device)
    return torch.cuda.memory_allocated() if device == "cuda" else None


def _gb(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / GB


def _engine(ctx: StageContext, settings: SmokeSettings) -> Any:
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout

    gpu_smoke.init_single_rank(ctx.device)
    engine = MegatronTrainingEngine(_require_model(ctx), gpu_smoke.engine_config(settings), MegatronLayout())
    if engine.megatron_optimizer != (ctx.device != "cpu"):
        raise StageFailed(
            f"the megatron engine on {ctx.device} chose megatron_optimizer={engine.megatron_optimizer}",
            {"optimizer": gpu_smoke.describe_optimizer(engine.optimizer)},
        )
    return engine


def _batch(ctx: StageContext, seed: int) -> Any:
    return gpu_smoke.smoke_batch(ctx.settings, ctx.shape["vocab_size"], seed=seed)


def _params(engine: Any) -> dict[str, Any]:
    return dict(engine.model.module.named_parameters())


def torch_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers that hold the state: each one megatron's ``ChainedOptimizer`` chains
    (``MegatronOptimizer.optimizer``, megatron-core 0.19.2 optimizer/optimizer.py), or the CPU
    path's ``precision.ParamOptimizer.torch_optimizer``."""
    import torch

    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [o.optimizer for o in chained]
    for name in ("torch_optimizer", "optimizer"):
        inner = getattr(optimizer, name, None)
        if isinstance(inner, torch.optim.Optimizer):
            return [inner]
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    raise TypeError(f"{type(optimizer).__name__}: no torch optimizer found inside it")


def optimizer_tensors(optimizer: Any) -> list[Any]:
    """Every tensor of the optimizer's state, in a fixed order: the parameters it steps (fp32 main
    parameters or shards under bf16) and each one's state tensors by key, ``step`` left out."""
    import torch

    out = []
    for inner in torch_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                out.append(p)
                state = inner.state.get(p, {})
                out += [state[k] for k in sorted(state) if k != "step" and isinstance(state[k], torch.Tensor)]
    return out


def _bit_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.detach().cpu(), b.detach().cpu()))


def _max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((a[n].detach().float() - b[n].detach().float()).abs().max()) for n in a)


def _unique_storage_bytes(tensors: list[Any], device_type: str) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type == device_type:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _timed_updates(
    engine: Any, batch: Any, steps: int, device: str
) -> tuple[list[float], list[dict[str, float]]]:
    seconds, metrics = [], []
    for _ in range(steps):
        tic = time.perf_counter()
        metrics.append(engine.update(batch, 1.0))
        _sync(device)
        seconds.append(time.perf_counter() - tic)
    return seconds, metrics


# ---- the stages ------------------------------------------------------------------------------------
def stage_env(ctx: StageContext) -> dict[str, Any]:
    import importlib
    import importlib.util
    import platform
    import sys

    import torch

    figures: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures.update(
            gpu=props.name, gpu_memory_gb=props.total_memory / GB, capability=f"{props.major}.{props.minor}",
            device_count=torch.cuda.device_count(), nccl=".".join(map(str, torch.cuda.nccl.version())),
        )  # fmt: skip
    missing = []
    for module, key in (("transformers", "transformers"), ("megatron.core", "megatron_core"),
                        ("numpy", "numpy"), ("safetensors", "safetensors")):  # fmt: skip
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{module} ({err})")
            continue
        figures[key] = getattr(imported, "__version__", "?")
        figures[f"{key}_from"] = str(Path(imported.__file__ or "?").parent)
    figures["optional"] = {
        name: importlib.util.find_spec(name) is not None
        for name in ("transformer_engine", "flash_attn", "apex")
    }
    figures["blocked"] = sorted(name for name, mod in sys.modules.items() if mod is None and "." not in name)
    if missing:
        raise StageFailed(f"not importable: {'; '.join(missing)}", figures)
    if ctx.device == "cuda" and not torch.cuda.is_available():
        raise StageFailed("torch sees no CUDA device", figures)
    return figures


def stage_model(ctx: StageContext) -> dict[str, Any]:
    tic = time.perf_counter()
    if ctx.model_dir.exists():
        shutil.rmtree(ctx.model_dir)
    gpu_smoke.build_model(ctx.model_dir, ctx.shape, device=ctx.device)
    return {
        "parameters": gpu_smoke.num_parameters(ctx.shape),
        "bytes_on_disk": sum(f.stat().st_size for f in ctx.model_dir.iterdir()),
        "seconds": time.perf_counter() - tic,
        "shape": ctx.shape,
    }


def _smoke(engine: str) -> Callable[[StageContext], dict[str, Any]]:
    def stage(ctx: StageContext) -> dict[str, Any]:
        result = gpu_smoke.run(
            ctx.settings, ctx.shape, [engine], ctx.work / f"smoke_{engine}", _require_model(ctx)
        )
        figures: dict[str, Any] = dict(result["engines"][engine])
        figures.update(
            device_name=result["device"], peak_flops=result["peak_flops"], settings=result["settings"]
        )
        return figures

    return stage


def stage_dist_optimizer(ctx: StageContext) -> dict[str, Any]:
    """megatron with ``use_distributed_optimizer`` and ``accumulate_allreduce_grads_in_fp32``."""
    import torch

    from mindspeed_rl.workers.colocation import grad_buffers

    settings = dataclasses.replace(
        ctx.settings, distributed_optimizer=True, grads_in_fp32=True, steps=min(ctx.settings.steps, 8)
    )
    gpu_smoke._reset_memory(ctx.device)
    engine = _engine(ctx, settings)
    figures: dict[str, Any] = {"optimizer": gpu_smoke.describe_optimizer(engine.optimizer)}
    figures["grad_buffer_dtypes"] = sorted({str(b.grad_data.dtype) for b in grad_buffers(engine.model)})
    figures["main_grad_dtypes"] = sorted(
        {str(p.main_grad.dtype) for p in engine.model.module.parameters() if p.requires_grad}
    )
    seconds, metrics = _timed_updates(engine, _batch(ctx, 0), settings.steps, ctx.device)
    timed = seconds[1:] or seconds
    tokens_per_s = settings.samples_per_step * settings.seq_length / (sum(timed) / len(timed))
    device_memory_gb = torch.cuda.get_device_properties(0).total_memory / GB if ctx.device == "cuda" else 80.0
    plan = gpu_smoke.planned_memory(ctx.shape, settings, engine="megatron", device_memory_gb=device_memory_gb)
    peak = gpu_smoke._peak_memory_gb(ctx.device)
    figures.update(
        tokens_per_s=tokens_per_s, step_seconds=seconds, peak_memory_gb=peak, planned_memory_gb=plan.total / GB,
        peak_over_planned=None if peak is None else peak / (plan.total / GB), planned_terms_gb=plan.as_gb(),
        losses=[m["loss"] for m in metrics], grad_norms=[m["grad_norm"] for m in metrics],
    )  # fmt: skip
    if figures["grad_buffer_dtypes"] != ["torch.float32"] or figures["main_grad_dtypes"] != ["torch.float32"]:
        raise StageFailed("accumulate_allreduce_grads_in_fp32 left a gradient that is not fp32", figures)
    if not all(math.isfinite(g) for g in figures["grad_norms"]):
        raise StageFailed("a gradient norm is not finite", figures)
    if ctx.device != "cpu" and "DistributedOptimizer" not in figures["optimizer"]:
        raise StageFailed("use_distributed_optimizer did not give megatron's DistributedOptimizer", figures)
    return figures


def stage_checkpoint(ctx: StageContext) -> dict[str, Any]:
    """One step, ``save_state`` (megatron dist_checkpointing + HF folder), a fresh engine,
    ``load_state``: every parameter and every optimizer state tensor bit-equal to the saved ones."""
    settings = dataclasses.replace(ctx.settings, distributed_optimizer=True)  # the shipped recipes' optimizer
    saved = _engine(ctx, settings)
    saved.update(_batch(ctx, 0), 1.0)
    folder = ctx.work / "checkpoint"
    shutil.rmtree(folder, ignore_errors=True)
    path = folder / "iter_0000001"
    path.mkdir(parents=True)
    _sync(ctx.device)
    tic = time.perf_counter()
    saved.save_state(path)
    save_s = time.perf_counter() - tic
    loaded = _engine(ctx, settings)  # the model folder's weights, a fresh optimizer
    before, fresh = _params(saved), _params(loaded)
    differed = not all(_bit_equal(t, fresh[n]) for n, t in before.items())
    tic = time.perf_counter()
    loaded.load_state(path)
    _sync(ctx.device)
    load_s = time.perf_counter() - tic
    after = _params(loaded)
    unequal = [n for n, t in before.items() if not _bit_equal(t, after[n])]
    saved_state, loaded_state = optimizer_tensors(saved.optimizer), optimizer_tensors(loaded.optimizer)
    state_unequal = sum(not _bit_equal(a, b) for a, b in zip(saved_state, loaded_state, strict=False))
    figures: dict[str, Any] = {
        "optimizer": gpu_smoke.describe_optimizer(saved.optimizer),
        "save_s": save_s, "load_s": load_s,
        "bytes_on_disk": sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
        "params": len(before), "params_differed_before_load": differed,
        "params_bit_equal": not unequal, "params_unequal": unequal[:5],
        "optimizer_tensors": len(saved_state), "optimizer_tensors_loaded": len(loaded_state),
        "optimizer_bit_equal": state_unequal == 0 and len(saved_state) == len(loaded_state),
        "optimizer_tensors_unequal": state_unequal,
    }  # fmt: skip
    # The next step on both: equal up to the kernels' determinism (CUDA's are not all bit-exact).
    batch = _batch(ctx, 1)
    figures["next_step_loss"] = [saved.update(batch, 1.0)["loss"], loaded.update(batch, 1.0)["loss"]]
    figures["next_step_max_abs_diff"] = _max_abs_diff(_params(saved), _params(loaded))
    if not differed:
        raise StageFailed(
            "the fresh engine already had the saved weights: the round trip proves nothing", figures
        )
    if unequal or not figures["optimizer_bit_equal"]:
        raise StageFailed("the loaded state differs from the saved state", figures)
    return figures


def stage_offload(ctx: StageContext) -> dict[str, Any]:
    """The colocated hybrid's trainer side on the real optimizer: a step, everything offloaded
    (``offload_train_state`` + ``free_device_cache``, as ``TrainingUnit.offload``), onloaded, then
    a step beside an engine that never moved."""
    from mindspeed_rl.workers.colocation import (
        free_device_cache,
        grad_buffers,
        offload_train_state,
        onload_train_state,
        train_state_tensors,
    )

    settings = dataclasses.replace(ctx.settings, distributed_optimizer=True)  # the shipped recipes' optimizer
    plain, cycled = _engine(ctx, settings), _engine(ctx, settings)
    first = _batch(ctx, 0)
    for engine in (plain, cycled):
        engine.update(first, 1.0)
    figures: dict[str, Any] = {"optimizer": gpu_smoke.describe_optimizer(cycled.optimizer)}
    params_host = {n: t.detach().cpu().clone() for n, t in _params(cycled).items()}
    state_host = [t.detach().cpu().clone() for t in optimizer_tensors(cycled.optimizer)]
    buffers = grad_buffers(cycled.model)
    figures["allocated_before_gb"] = _gb(_allocated(ctx.device))
    figures["grad_buffer_bytes_before"] = sum(b.grad_data.untyped_storage().nbytes() for b in buffers)
    try:
        moved = train_state_tensors(cycled.model, cycled.optimizer, ALL_PARTS)
    except Exception as err:  # colocation.py's own refusal (e.g. an optimizer it cannot see into)
        raise StageFailed(f"train_state_tensors: {type(err).__name__}: {err}", figures) from err
    device_type = "cuda" if ctx.device == "cuda" else "cpu"
    figures["expected_gb"] = _unique_storage_bytes(moved, device_type) / GB
    del moved  # a reference kept here would keep each moved tensor's device memory alive
    tic = time.perf_counter()
    offload_train_state(cycled.model, cycled.optimizer, ALL_PARTS)
    free_device_cache(ctx.device)
    offloaded = _allocated(ctx.device)
    figures["offload_s"] = time.perf_counter() - tic
    figures["allocated_offloaded_gb"] = _gb(offloaded)
    figures["grad_buffer_bytes_offloaded"] = sum(b.grad_data.untyped_storage().nbytes() for b in buffers)
    tic = time.perf_counter()
    onload_train_state(cycled.model, cycled.optimizer, ALL_PARTS, ctx.device)
    figures["allocated_onloaded_gb"] = _gb(_allocated(ctx.device))
    figures["onload_s"] = time.perf_counter() - tic
    before, off = figures["allocated_before_gb"], figures["allocated_offloaded_gb"]
    figures["freed_gb"] = None if before is None or off is None else before - off
    figures["params_restored_bit_equal"] = all(
        _bit_equal(t, params_host[n]) for n, t in _params(cycled).items()
    )
    back = optimizer_tensors(cycled.optimizer)
    figures["optimizer_restored_bit_equal"] = len(back) == len(state_host) and all(
        _bit_equal(a, b) for a, b in zip(back, state_host, strict=True)
    )
    figures["optimizer_on_device_after_onload"] = all(t.device.type == device_type for t in back)
    second = _batch(ctx, 1)
    figures["next_step_loss"] = [plain.update(second, 1.0)["loss"], cycled.update(second, 1.0)["loss"]]
    figures["next_step_max_abs_diff"] = _max_abs_diff(_params(plain), _params(cycled))
    if not (figures["params_restored_bit_equal"] and figures["optimizer_restored_bit_equal"]):
        raise StageFailed("the onloaded state differs from the state before the offload", figures)
    if not figures["optimizer_on_device_after_onload"]:
        raise StageFailed("onload left optimizer state off the device", figures)
    if figures["grad_buffer_bytes_offloaded"] != 0:
        raise StageFailed("offload left megatron's gradient buffers allocated", figures)
    # Most of the state must leave the device (the rest: allocator rounding, the other engine).
    if figures["freed_gb"] is not None and figures["freed_gb"] < 0.9 * figures["expected_gb"]:
        raise StageFailed("offload freed less device memory than the state it moved", figures)
    return figures


def stage_collective(ctx: StageContext) -> dict[str, Any]:
    from benchmarks.device_transport import collective_round_trip

    return collective_round_trip(_require_model(ctx), device=ctx.device, bucket_mb=ctx.bucket_mb)


def _host_weights(engine: Any) -> dict[str, Any]:
    """The exported bf16 weights on the host, copied (a later update must not change them)."""
    return {name: t.clone() for name, t in engine.named_weights_for_inference()}


DELTA_SECOND_LR_IF_UNDER_S = 70.0
"""The delta stage measures lr 1e-5 only when lr 1e-6 left room for it under the stage's timeout."""


def stage_delta(ctx: StageContext) -> dict[str, Any]:
    """Issue #40's delta measurement at the size a 24 GB CPU host could not hold: the model stage's
    Qwen3-0.6B shape in bf16, stepped by the torch engine on the device (fp32 masters) at RL
    learning rates (``DEVICE_CHECK_DELTA_LRS``, default 1e-6,1e-5), then per refresh the delta codec against a full send (``snapshot_io_delta``'s
    cases: ``identity`` and ``tp2_to_tp1`` over an in-memory medium, and the wired ``shared_fs``
    exporters and GU end writing to this host's disk), each checked bit for bit. Ray is absent on
    the device, so the object_store case is not measured here."""
    import statistics

    from benchmarks import snapshot_io_delta as sid
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.weights.layout import TrainingLayout, hf_dense_rules

    model = _require_model(ctx)
    steps = 2 if ctx.size == "tiny" else 3
    figures: dict[str, Any] = {"steps_per_lr": steps, "cases": {}}
    layouts = (
        ("identity", TrainingLayout()),
        ("tp2_to_tp1", TrainingLayout(tp_size=2, rules=hf_dense_rules())),
    )
    scratch = ctx.work / "delta"
    started = time.perf_counter()
    lrs = [float(x) for x in os.environ.get("DEVICE_CHECK_DELTA_LRS", "1e-6,1e-5").split(",")]
    for lr in lrs:
        if lr != lrs[0] and time.perf_counter() - started > DELTA_SECOND_LR_IF_UNDER_S:
            figures["skipped"] = (
                f"lr={lr:g}: the first learning rate took over {DELTA_SECOND_LR_IF_UNDER_S:.0f} s"
            )
            break
        settings = dataclasses.replace(ctx.settings, lr=lr)
        engine = TorchTrainingEngine(model, gpu_smoke.engine_config(settings))
        versions = [_host_weights(engine)]
        params = sum(t.numel() for t in versions[0].values())
        changed, update_s = [], []
        for step in range(steps):
            tic = time.perf_counter()
            engine.update(_batch(ctx, step), 1.0)
            _sync(ctx.device)
            update_s.append(time.perf_counter() - tic)
            versions.append(_host_weights(engine))
            old = {k: sid.words(v) for k, v in versions[-2].items()}
            new = {k: sid.words(v) for k, v in versions[-1].items()}
            changed.append(sum(int((old[k] != new[k]).sum()) for k in new) / params)
        del engine
        gc.collect()
        case: dict[str, Any] = {
            "params": params, "dtype": str(next(iter(versions[0].values())).dtype),
            "full_bytes": sum(t.numel() * t.element_size() for t in versions[0].values()),
            "changed_fraction": changed, "update_s": update_s,
        }  # fmt: skip
        for name, layout in layouts:
            r = sid.refresh_case(layout, versions, sid.memory_medium)
            case[f"{name}/memory"] = {
                "delta_s": statistics.median(r["delta_s"]), "full_s": statistics.median(r["full_s"]),
                "seconds_ratio": statistics.median(d / f for d, f in zip(r["delta_s"], r["full_s"], strict=True)),
                "bytes_ratio": statistics.median(
                    d / f for d, f in zip(r["delta_bytes"], r["full_bytes"], strict=True)
                ),
            }  # fmt: skip
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            case[f"{name}/shared_fs_wired"] = sid.wired_case(layout, versions, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        figures["cases"][f"lr={lr:g}"] = case
        del versions
        gc.collect()
    for lr_key, case in figures["cases"].items():  # the headline figures, per learning rate
        figures["params"] = case["params"]
        tag = lr_key.removeprefix("lr=").replace("e-0", "e-")
        figures[f"changed_fraction_lr{tag}"] = statistics.median(case["changed_fraction"])
        for key in ("identity/shared_fs_wired", "tp2_to_tp1/shared_fs_wired", "identity/memory"):
            figures[f"{key}:bytes_ratio_lr{tag}"] = case[key]["bytes_ratio"]
            figures[f"{key}:seconds_ratio_lr{tag}"] = case[key]["seconds_ratio"]
    return figures


STAGE_FUNCS: dict[str, Callable[[StageContext], dict[str, Any]]] = {
    "env": stage_env,
    "model": stage_model,
    "smoke_torch": _smoke("torch"),
    "smoke_megatron": _smoke("megatron"),
    "dist_optimizer": stage_dist_optimizer,
    "checkpoint": stage_checkpoint,
    "offload": stage_offload,
    "collective": stage_collective,
    "delta": stage_delta,
}
