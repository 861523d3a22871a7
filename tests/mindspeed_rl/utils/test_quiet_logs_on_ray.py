"""The quiet defaults reach every Ray actor through the runtime_env hook init_ray sets."""

from __future__ import annotations

import pytest

from mindspeed_rl.utils import quiet_logs
from tests.support.ray_cluster import init_in_process

pytestmark = [pytest.mark.integration]


class _Probe:
    """An actor that logs as vLLM would and reports what its handler let through."""

    def emitted(self) -> dict[str, object]:
        import io
        import logging
        import os
        import warnings

        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        logger.addHandler(handler)
        logger.warning("RotaryEmbedding: Failed to load weights")
        logger.error("QKVParallelLinear: Failed to load weights")
        logger.removeHandler(handler)
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("`torch.distributed.reduce_op` is deprecated", FutureWarning, stacklevel=1)
        return {
            "lines": stream.getvalue().splitlines(),
            "warnings": len(seen),
            "vllm_level": os.environ.get("VLLM_LOGGING_LEVEL"),
            "cpp_level": os.environ.get("TORCH_CPP_LOG_LEVEL"),
        }


def test_every_actor_filters_engine_noise_and_keeps_errors() -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running in this process")
    import sys

    runtime_env = quiet_logs.worker_runtime_env({"env_vars": {}}, {})
    init_in_process(num_cpus=1, include_dashboard=False, runtime_env=runtime_env)
    try:
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        probe = ray.remote(_Probe).options(num_cpus=0.1).remote()
        seen = ray.get(probe.emitted.remote(), timeout=180)
    finally:
        ray.shutdown()
    assert seen["lines"] == ["QKVParallelLinear: Failed to load weights"]
    assert seen["warnings"] == 0
    assert (seen["vllm_level"], seen["cpp_level"]) == ("WARNING", "ERROR")
