"""Starting gloo ranks as processes with their imports paid once per parent process.

``spawn`` starts every rank as a fresh interpreter that imports torch and megatron-core again:
about 6 s of CPU per rank on the 2-core host, for imports that are the same every time (the
parity benchmarks and the megatron tests start ranks dozens of times per test session).
``start_ranks`` uses multiprocessing's ``forkserver`` instead, preloaded with those modules: the
server imports them once, on first use, and forks each rank from itself, so a rank starts with
them loaded. The server only imports (no tensor work, no process group), so its forks start as
``spawn``'s ranks would, minus the imports; every caller's tests pass either way (the megatron
folder on megatron-core 0.19.2 and on 0.12.1, ``make test-mcore012``).

One difference from ``spawn``: a forked rank's environment is the server's (the parent's when the
server started), not the parent's at the call. So ``start_ranks`` remembers the environment the
server started with and, when the parent's differs at a call (a test that set a variable), starts
that call's ranks with ``spawn``: slower, never wrong. Callers pass what a rank needs as arguments.
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
_server_env: dict[str, str] | None = None
"""This process's environment when its forkserver started (None: not started by us yet)."""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _VOLATILE}


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
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method=method)
