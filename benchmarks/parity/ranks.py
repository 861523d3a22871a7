"""Starting gloo ranks as processes with their imports paid once per parent process.

``spawn`` starts every rank as a fresh interpreter that imports torch and megatron-core again:
about 6 s of CPU per rank on the 2-core host, for imports that are the same every time (the
parity benchmarks and the megatron tests start ranks dozens of times per test session).
``start_ranks`` uses multiprocessing's ``forkserver`` instead, preloaded with those modules: the
server imports them once, on first use, and forks each rank from itself, so a rank starts with
them loaded. The server only imports (no tensor work, no process group), so its forks start as
``spawn``'s ranks would, minus the imports; every caller's tests pass either way (the megatron
folder on megatron-core 0.19.2 and on 0.12.1, ``make test-mcore012``).

One difference from ``spawn``: a forked rank inherits the server's environment (the parent's when
the server started), not the parent's at the call. So each forked rank is handed the parent's
environment at the call and takes it before it runs, and ``start_ranks`` remembers the environment
the server started with: when the parent's differs at a call in a variable that an import of the
preloaded modules could read (a test that set one), that call's ranks start with ``spawn``: slower,
never wrong. A few variables are known to change in a long-lived parent without mattering to those
imports (``_set_by_neighbours``): importing vLLM and starting Ray in-process set them, and before
they were exempt every rank a pytest worker started after such a test was spawned (about 7 s of
CPU each).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

# What the ranks import. The server skips a module that does not import (a megatron-less install).
PRELOAD = (
    "torch",
    "torch.distributed",
    "safetensors.torch",
    "transformers",
    "megatron.core",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "megatron.core.dist_checkpointing",
    "mindspeed_rl.models.training.megatron.engine",
)


# pytest rewrites this one before every test; no rank reads it.
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
# What importing vLLM and building an engine (0.32: its settings, inductor's, triton's, aiter's),
# importing OpenCV (through vLLM: it prepends its own libraries to LD_LIBRARY_PATH "for
# sub-processes") and ray.init (2.60: client and auth mode, usage stats, the breakpoint hook) write
# into os.environ and never undo. The preloaded modules read none of them while importing: torch
# and megatron-core have loaded their libraries by then, from their own paths. A rank reads them,
# if at all, at run time, from the environment it is handed (``_in_env``). Two more, found by
# logging every fallback of a whole suite run (44 spawned ranks): inductor's pointer for the C++
# kernel it just compiled in this process, and our quiet_logs' HF_HUB_DISABLE_PROGRESS_BARS, which
# huggingface_hub does read at import, for its progress bars only (a forked rank may draw them).
_NEIGHBOUR_PREFIXES = ("VLLM_", "AITER_", "TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_", "TILELANG_", "RAY_")
_NEIGHBOUR_KEYS = frozenset(
    {
        "PYTORCH_NVML_BASED_CUDA_CHECK", "NUMEXPR_MAX_THREADS", "PYTHONBREAKPOINT", "LD_LIBRARY_PATH",
        "HF_HUB_DISABLE_PROGRESS_BARS",
    }
)  # fmt: skip
_server_env: dict[str, str] | None = None
"""This process's environment when its forkserver started (None: not started by us yet)."""


def _env() -> dict[str, str]:
    """The variables whose change sends a call's ranks to ``spawn``."""
    return {k: v for k, v in os.environ.items() if not _set_by_neighbours(k)}


def _set_by_neighbours(key: str) -> bool:
    return key in _VOLATILE or key in _NEIGHBOUR_KEYS or key.startswith(_NEIGHBOUR_PREFIXES)


def _method() -> str:
    """``forkserver`` while the environment is the one the server started with, else ``spawn``."""
    global _server_env
    if _server_env is None:
        _server_env = _env()
        return "forkserver"
    return "forkserver" if _env() == _server_env else "spawn"


def context() -> Any:
    """The multiprocessing context the next ``start_ranks`` uses (queues passed to the ranks must
    come from it): the preloaded forkserver, or ``spawn`` (see the module docstring)."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    return multiprocessing.get_context(_method())


def start_ranks(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, joined; a rank's exception is raised here
    (``torch.multiprocessing.start_processes``)."""
    import torch.multiprocessing as mp

    method = context().get_start_method()
    if method == "forkserver":
        fn, args = _in_env, (dict(os.environ), fn, *args)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method=method)


def _in_env(rank: int, env: dict[str, str], fn: Callable[..., Any], *args: Any) -> Any:
    """A forked rank: the caller's environment at the call, then ``fn`` (as a spawned rank would)."""
    os.environ.clear()
    os.environ.update(env)
    return fn(rank, *args)
