"""quiet_logs: listed engine noise is dropped, everything else (a real vLLM error) still shows."""

from __future__ import annotations

import io
import logging
import sys
import warnings
from collections.abc import Iterator

import pytest

from mindspeed_rl.utils import quiet_logs

LAYERWISE = "vllm.model_executor.model_loader.reload.layerwise"


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, dict[str, str]]]:
    """A handler on the vllm logger tree and a private environment; filters removed afterwards."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger("vllm")
    saved = (root.level, root.propagate)
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    env: dict[str, str] = {}
    with warnings.catch_warnings():
        yield stream, env
    root.removeHandler(handler)
    root.setLevel(saved[0])
    for noise in quiet_logs.NOISE:
        logger = logging.getLogger(noise.logger)
        for f in [f for f in logger.filters if isinstance(f, quiet_logs.NoiseFilter)]:
            logger.removeFilter(f)


def test_listed_noise_is_dropped_and_real_problems_pass(captured: tuple[io.StringIO, dict[str, str]]) -> None:
    stream, env = captured
    assert quiet_logs.install(env=env) is True
    layerwise = logging.getLogger(LAYERWISE)
    layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")  # per reload, harmless
    layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real failure
    logging.getLogger("vllm.v1.core.block_pool").info("Successfully reset prefix cache")
    logging.getLogger("vllm.v1.core.block_pool").error(
        "Failed to reset prefix cache because some blocks are in use"
    )
    logging.getLogger("vllm.v1.worker.cpu_worker").warning("libiomp is not found in LD_PRELOAD. For best ...")
    logging.getLogger("vllm.v1.worker.cpu_worker").warning("KV cache is too small for this model")
    # An error is never noise, even when its text matches a listed pattern.
    layerwise.error("RotaryEmbedding: Failed to load weights")
    lines = stream.getvalue().splitlines()
    assert lines == [
        "QKVParallelLinear: Failed to load weights",
        "Failed to reset prefix cache because some blocks are in use",
        "KV cache is too small for this model",
        "RotaryEmbedding: Failed to load weights",
    ]


def test_install_sets_quiet_defaults_without_overriding_the_user(
    captured: tuple[io.StringIO, dict[str, str]],
) -> None:
    _, env = captured
    env["VLLM_LOGGING_LEVEL"] = "DEBUG"  # the user's explicit choice wins
    quiet_logs.install(env=env, worker=True)
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["TORCH_CPP_LOG_LEVEL"] == "ERROR"  # workers only
    quiet_logs.install(env=env)  # idempotent: still one filter per logger
    assert sum(isinstance(f, quiet_logs.NoiseFilter) for f in logging.getLogger(LAYERWISE).filters) == 1


def test_the_reduce_op_future_warning_is_filtered_others_are_not(
    captured: tuple[io.StringIO, dict[str, str]],
) -> None:
    _, env = captured
    quiet_logs.install(env=env)
    with warnings.catch_warnings(record=True) as seen:
        # catch_warnings(record=True) resets to "always" only if asked; keep the installed filters.
        warnings.warn(
            "`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning, stacklevel=1
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]


def test_debug_switch_installs_nothing(captured: tuple[io.StringIO, dict[str, str]]) -> None:
    stream, env = captured
    env[quiet_logs.LOG_ENV] = "debug"
    assert quiet_logs.install(env=env) is False
    assert "VLLM_LOGGING_LEVEL" not in env
    logging.getLogger(LAYERWISE).warning("RotaryEmbedding: Failed to load weights")
    assert stream.getvalue() == "RotaryEmbedding: Failed to load weights\n"
    assert logging.getLogger("mindspeed_rl").level == logging.DEBUG
    logging.getLogger("mindspeed_rl").setLevel(logging.NOTSET)


def test_worker_runtime_env_adds_the_hook_and_carries_the_switch() -> None:
    base = {"env_vars": {"A": "1"}}
    out = quiet_logs.worker_runtime_env(base, {quiet_logs.LOG_ENV: "debug"})
    assert out["worker_process_setup_hook"] == quiet_logs.WORKER_SETUP_HOOK
    assert out["env_vars"] == {"A": "1", quiet_logs.LOG_ENV: "debug"}
    assert base == {"env_vars": {"A": "1"}}  # not mutated
    theirs = quiet_logs.worker_runtime_env({"worker_process_setup_hook": "my.hook"}, {})
    assert theirs["worker_process_setup_hook"] == "my.hook"
    # The hook is importable by the dotted path Ray is given.
    module, _, name = quiet_logs.WORKER_SETUP_HOOK.rpartition(".")
    assert getattr(sys.modules[module], name) is quiet_logs.install_worker


@pytest.mark.vllm
def test_a_real_vllm_error_still_reaches_vllm_s_own_handler() -> None:
    """Through vLLM's own logging setup (the config every engine applies at start, its handler
    and format), with the quiet defaults installed first, as in an actor."""
    pytest.importorskip("vllm")
    env: dict[str, str] = {}
    quiet_logs.install(env=env)
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging, init_logger

    root = logging.getLogger("vllm")
    saved = (list(root.handlers), root.propagate, root.level)
    try:
        configure_logging(LoggingConfig())  # what LLMEngine does when an engine starts
        (handler,) = root.handlers
        assert isinstance(handler, logging.StreamHandler)
        stream = io.StringIO()
        handler.setStream(stream)
        log = init_logger(LAYERWISE)
        log.warning("RotaryEmbedding: Failed to load weights")
        log.error("QKVParallelLinear: Failed to load weights")
        text = stream.getvalue()
        assert "ERROR" in text and "QKVParallelLinear: Failed to load weights" in text
        assert "RotaryEmbedding" not in text
    finally:
        root.handlers[:] = saved[0]
        root.propagate, root.level = saved[1], saved[2]
        for noise in quiet_logs.NOISE:
            logger = logging.getLogger(noise.logger)
            for f in [f for f in logger.filters if isinstance(f, quiet_logs.NoiseFilter)]:
                logger.removeFilter(f)
