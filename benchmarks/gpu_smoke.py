"""GPU smoke benchmark of both training engines: throughput, MFU and peak memory against the plan.

On one GPU: a random Qwen3 of the 0.6 B shape (built here, nothing downloaded), sequences of 2048
tokens, 20 optimizer steps in bf16 per engine::

    megatron engine, TP1: megatron's optimizer (fp32 main params + Adam moments), DDP gradient buffer
    torch engine:         HF model, fp32 masters (precision.MasterWeightOptimizer)
        -> tokens/s (steps after the first), MFU = 6 N tokens/s / dense bf16 peak,
           torch.cuda.max_memory_allocated vs plan/memory.py's trainer_memory

    python -m benchmarks.gpu_smoke --json runs/gpu_smoke.json            # a CUDA host
    python -m benchmarks.gpu_smoke --dry-run --json /tmp/smoke.json      # any host: tiny model, CPU

The GPU host needs torch with CUDA, transformers and megatron-core (``pip install --no-deps
megatron_core-0.19.2-*.whl``); no vLLM, no Ray, no network. ``--dry-run`` runs the same code on a
tiny model on CPU (gloo, the engines' torch-optimizer path, a few short steps): it proves the
script, not the numbers. The JSON: ``{"engines": {"megatron": {"tokens_per_s", "mfu",
"peak_memory_gb", "planned_memory_gb", "peak_over_planned", "optimizer", ...}, "torch": {...}},
"device", "model", ...}``. ``peak_memory_gb`` is None on CPU (no allocator statistics there);
``optimizer`` names the class that stepped (on a GPU, megatron's ``ChainedOptimizer`` and what it
chains). ``benchmarks/device_check.sh`` runs each engine of this script as one of its stages.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Dense bf16 peak of one device, FLOP/s (NVIDIA datasheets, without sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
}
DEFAULT_PEAK = 989e12  # H200

# Qwen3-0.6B's shape (tied embeddings): about 0.6 B parameters, 0.44 B outside the embedding.
QWEN3_SMALL: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}  # fmt: skip
QWEN3_TINY: dict[str, Any] = {
    **QWEN3_SMALL, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class SmokeSettings:
    steps: int
    seq_length: int
    samples_per_step: int
    micro_batch_size: int
    param_dtype: str
    device: str
    lr: float = 1e-6
    distributed_optimizer: bool = False
    """The megatron engine's ``use_distributed_optimizer`` (an accelerator only: the CPU path
    steps a torch optimizer and ignores it)."""
    grads_in_fp32: bool = False
    """The megatron engine's ``accumulate_allreduce_grads_in_fp32``: an fp32 DDP gradient buffer."""


def build_model(path: Path, shape: dict[str, Any], *, device: str, seed: int = 0) -> Path:
    """A random Qwen3 HF folder of ``shape`` in bf16 (initialised on ``device``, then saved)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**shape, pad_token_id=0), dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    return path


def num_parameters(shape: dict[str, Any]) -> int:
    """Parameters of the HF model (a tied output layer counted once)."""
    from mindspeed_rl.plan.memory import rank_parameters

    return rank_parameters(model_shape(shape), tp=1, pp=1, ep=1, pp_rank=0, divisible_by=1).total


def model_shape(shape: dict[str, Any]) -> Any:
    from mindspeed_rl.plan.memory import ModelShape

    return ModelShape(
        num_layers=shape["num_hidden_layers"], hidden_size=shape["hidden_size"],
        ffn_hidden_size=shape["intermediate_size"], num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_key_value_heads"], head_dim=shape["head_dim"],
        vocab_size=shape["vocab_size"], tied_embeddings=shape["tie_word_embeddings"], qkv_bias=False,
        qk_layernorm=True,
    )  # fmt: skip


def planned_memory(
    shape: dict[str, Any], settings: SmokeSettings, *, engine: str, device_memory_gb: float
) -> Any:
    """``plan/memory.py``'s estimate for one rank. The megatron engine: DDP buffer in the
    parameters' dtype unless ``settings.grads_in_fp32``, the distributed optimizer as
    ``settings`` says, megatron's unfused attention with the local spec unless TransformerEngine
    is installed. The torch engine: fp32 gradients (its masters' grads), SDPA attention (no s x s
    scores kept)."""
    from mindspeed_rl.models.training.megatron.layout import transformer_engine_importable
    from mindspeed_rl.plan.memory import TrainerMemorySpec, trainer_memory

    spec = TrainerMemorySpec(
        shape=model_shape(shape), tp=1, pp=1, ep=1, world_size=1, make_vocab_size_divisible_by=128,
        param_dtype=settings.param_dtype,  # type: ignore[arg-type]
        grads_in_fp32=engine == "torch" or settings.param_dtype == "float32" or settings.grads_in_fp32,
        distributed_optimizer=engine == "megatron" and settings.distributed_optimizer and settings.device != "cpu",
        reference=False, micro_batch_size=settings.micro_batch_size, seq_length=settings.seq_length,
        sequence_parallel=False,
        flash_attention=engine == "torch" or (settings.device == "cuda" and transformer_engine_importable()),
        recompute_granularity=None,
    )  # fmt: skip
    return trainer_memory(spec, device_memory_gb)


def smoke_batch(settings: SmokeSettings, vocab_size: int, seed: int = 0) -> Any:
    """Random prompts and responses of ``seq_length`` tokens in all, half each."""
    from mindspeed_rl.models.training.batch import TrainBatch

    rng = np.random.default_rng(seed)
    n, half = settings.samples_per_step, settings.seq_length // 2
    return TrainBatch.from_lists(
        prompt_ids=[rng.integers(1, vocab_size, size=settings.seq_length - half) for _ in range(n)],
        response_ids=[rng.integers(1, vocab_size, size=half) for _ in range(n)],
        advantages=rng.normal(size=n).astype(np.float32),
    )


def engine_config(settings: SmokeSettings) -> Any:
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

    return TorchEngineConfig(
        lr=settings.lr, micro_batch_size=settings.micro_batch_size, forward_micro_batch_size=settings.micro_batch_size,
        mini_batch_size=settings.samples_per_step, n_samples_per_prompt=1, loss=GRPOLossConfig(init_kl_coef=0.0),
        device=settings.device,  # type: ignore[arg-type]
        param_dtype=settings.param_dtype,  # type: ignore[arg-type]
        use_distributed_optimizer=settings.distributed_optimizer,
        accumulate_allreduce_grads_in_fp32=settings.grads_in_fp32,
    )  # fmt: skip


def _peak_flops(device: str) -> tuple[float, str]:
    import torch

    if device != "cuda":
        return DEFAULT_PEAK, "cpu (MFU against the H200 peak: meaningless, for the format only)"
    name = torch.cuda.get_device_name(0)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops, name
    return DEFAULT_PEAK, f"{name} (unknown peak: the H200's used)"


def _reset_memory(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _allocated_gb(device: str) -> float | None:
    import torch

    return torch.cuda.memory_allocated() / 1e9 if device == "cuda" else None


def _peak_memory_gb(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None


def time_updates(engine: Any, batch: Any, steps: int, device: str) -> list[float]:
    """Seconds of each of ``steps`` updates of one optimizer step each."""
    import torch

    seconds = []
    for _ in range(steps):
        tic = time.perf_counter()
        engine.update(batch, 1.0)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - tic)
    return seconds


@dataclass(frozen=True, slots=True)
class EngineRun:
    seconds: list[float]
    optimizer: str
    """Which optimizer stepped (``describe_optimizer``): megatron's from ``get_megatron_optimizer``
    on an accelerator, the torch engine's mixed-precision one on a CPU host."""


def describe_optimizer(optimizer: Any) -> str:
    """The optimizer's class, and for megatron's ``ChainedOptimizer`` the classes it chains
    (``chained_optimizers`` in megatron-core 0.12.1 and 0.19.2, optimizer/optimizer.py)."""
    name = type(optimizer).__name__
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is None:
        return name
    return f"{name}[{', '.join(type(o).__name__ for o in chained)}]"


def _report(
    name: str, run: EngineRun, tokens_per_step: int, n_params: int, settings: SmokeSettings,
    shape: dict[str, Any], device_memory_gb: float, peak_flops: float,
) -> dict[str, Any]:  # fmt: skip
    seconds = run.seconds
    timed = seconds[1:] if len(seconds) > 1 else seconds  # the first step compiles and allocates
    tokens_per_s = tokens_per_step / float(np.mean(timed))
    plan = planned_memory(shape, settings, engine=name, device_memory_gb=device_memory_gb)
    peak = _peak_memory_gb(settings.device)
    return {
        "tokens_per_s": tokens_per_s,
        "mfu": 6 * n_params * tokens_per_s / peak_flops,
        "peak_memory_gb": peak,
        "planned_memory_gb": plan.total / 1e9,
        "peak_over_planned": None if peak is None else peak / (plan.total / 1e9),
        "planned_terms_gb": plan.as_gb(),
        "step_seconds": seconds,
        "optimizer": run.optimizer,
    }


def init_single_rank(device: str) -> None:
    """A default process group of one rank (NCCL on CUDA, gloo on CPU), as megatron needs one."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device == "cuda":
        torch.cuda.set_device(0)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def run_megatron(model_dir: Path, settings: SmokeSettings, batch: Any) -> EngineRun:
    """The megatron engine at TP1 on this process (a world of one)."""
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout

    init_single_rank(settings.device)
    engine = MegatronTrainingEngine(model_dir, engine_config(settings), MegatronLayout())
    try:
        seconds = time_updates(engine, batch, settings.steps, settings.device)
        return EngineRun(seconds, describe_optimizer(engine.optimizer))
    finally:
        del engine


def run_torch(model_dir: Path, settings: SmokeSettings, batch: Any) -> EngineRun:
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    engine = TorchTrainingEngine(model_dir, engine_config(settings))
    try:
        seconds = time_updates(engine, batch, settings.steps, settings.device)
        return EngineRun(seconds, describe_optimizer(engine.optimizer))
    finally:
        del engine


RUNNERS: dict[str, Callable[[Path, SmokeSettings, Any], EngineRun]] = {
    "megatron": run_megatron,
    "torch": run_torch,
}


def run(
    settings: SmokeSettings,
    shape: dict[str, Any],
    engines: list[str],
    work: Path,
    model_dir: Path | None = None,
) -> dict[str, Any]:
    """``engines`` on a random Qwen3 of ``shape``: built under ``work`` unless ``model_dir`` holds one."""
    import torch

    if model_dir is None:
        model_dir = build_model(work / "model", shape, device=settings.device)
    n_params = num_parameters(shape)
    batch = smoke_batch(settings, shape["vocab_size"])
    tokens_per_step = settings.samples_per_step * settings.seq_length
    peak_flops, device_name = _peak_flops(settings.device)
    device_memory_gb = (
        torch.cuda.get_device_properties(0).total_memory / 1e9 if settings.device == "cuda" else 80.0
    )
    results = {}
    for name in engines:
        _reset_memory(settings.device)
        before = _allocated_gb(settings.device)
        engine_run = RUNNERS[name](model_dir, settings, batch)
        results[name] = _report(
            name, engine_run, tokens_per_step, n_params, settings, shape, device_memory_gb, peak_flops
        )
        results[name]["allocated_before_gb"] = before  # left over by what ran earlier in the process
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'planned_terms_gb'})}")
    return {
        "engines": results,
        "device": device_name,
        "model": {"parameters": n_params, **shape},
        "settings": {
            "steps": settings.steps,
            "seq_length": settings.seq_length,
            "samples_per_step": settings.samples_per_step,
            "micro_batch_size": settings.micro_batch_size,
            "param_dtype": settings.param_dtype,
            "distributed_optimizer": settings.distributed_optimizer,
            "grads_in_fp32": settings.grads_in_fp32,
        },  # fmt: skip
        "peak_flops": peak_flops,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU, a few short steps")
    parser.add_argument("--json", type=Path, help="write the results here")
    # The torch engine first: megatron keeps process-wide state (parallel groups, buffers) after
    # its engine is gone, which would count towards the next engine's peak.
    parser.add_argument("--engines", default="torch,megatron", help="comma-separated: torch, megatron")
    parser.add_argument("--steps", type=int, help="optimizer steps per engine (20; dry run 3)")
    parser.add_argument("--seq-length", type=int, help="tokens per sample (2048; dry run 64)")
    parser.add_argument("--samples-per-step", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="bfloat16 (dry run: float32)")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(RUNNERS))
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {sorted(RUNNERS)}")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here; pass --dry-run to check the script on CPU")
    settings = SmokeSettings(
        steps=args.steps or (3 if args.dry_run else 20),
        seq_length=args.seq_length or (64 if args.dry_run else 2048),
        samples_per_step=args.samples_per_step,
        micro_batch_size=args.micro_batch_size,
        param_dtype=args.dtype or ("float32" if args.dry_run else "bfloat16"),
        device="cpu" if args.dry_run else "cuda",
    )
    if args.dry_run:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        result = {
            "dry_run": args.dry_run,
            **run(settings, QWEN3_TINY if args.dry_run else QWEN3_SMALL, engines, Path(tmp)),
        }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
