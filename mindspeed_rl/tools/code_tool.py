"""The code-interpreter tool: runs the ``code`` argument in the sandbox (``sandbox.py``).

Config keys follow upstream's ``configs/tools/retool_config.yaml`` (MindSpeed-RL master,
commit 88bc30d): ``sandbox_fusion_url``, ``num_workers``, ``enable_global_rate_limit``,
``rate_limit``, ``default_timeout``, ``default_language``, ``memory_limit_mb``, ``type``; plus this
framework's ``isolate_network`` and ``max_output_bytes`` for the local sandbox.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from mindspeed_rl.tools.base import ToolResult, argument_error
from mindspeed_rl.tools.sandbox import (
    RunResult,
    SandboxLimits,
    network_namespace_available,
    run_code_on_sandbox_fusion,
    run_python_locally,
)

_KEYS = frozenset(
    {
        "sandbox_fusion_url",
        "num_workers",
        "enable_global_rate_limit",
        "rate_limit",
        "default_timeout",
        "default_language",
        "memory_limit_mb",
        "type",
        "isolate_network",
        "max_output_bytes",
    }
)


class CodeInterpreterTool:
    """Executes Python; ``sandbox_fusion_url`` set: on that SandboxFusion server, else locally."""

    def __init__(self, config: Mapping[str, Any], tool_schema: Mapping[str, Any]) -> None:
        unknown = sorted(set(config) - _KEYS)
        if unknown:
            raise ValueError(f"code tool config: unknown key(s) {unknown}; valid keys: {sorted(_KEYS)}")
        self._schema = dict(tool_schema)
        self._url: str | None = config.get("sandbox_fusion_url") or None
        self._language = str(config.get("default_language", "python"))
        self._limits = SandboxLimits(
            timeout_s=float(config.get("default_timeout", 30)),
            memory_limit_mb=int(config.get("memory_limit_mb", 1024)),
            max_output_bytes=int(config.get("max_output_bytes", 64 * 1024)),
            isolate_network=bool(config.get("isolate_network", True)),
        )
        if self._url is None and self._language != "python":
            raise ValueError(
                f"code tool: default_language={self._language!r} needs a SandboxFusion server "
                "(sandbox_fusion_url); the local sandbox runs python only"
            )
        if self._url is None and self._limits.isolate_network and not network_namespace_available():
            raise ValueError(
                "code tool: the local sandbox cannot isolate the network on this machine (unprivileged user "
                "namespaces are off); set sandbox_fusion_url to a SandboxFusion server, or isolate_network: "
                "false in the tool config to accept code with network access"
            )
        workers = int(config.get("num_workers", 4))
        if config.get("enable_global_rate_limit", False):
            workers = min(workers, int(config.get("rate_limit", workers)))
        if workers < 1:
            raise ValueError(
                f"code tool: num_workers / rate_limit give {workers} concurrent runs; use 1 or more"
            )
        # Bounds concurrent executions of this tool whatever the agent loop's pool size.
        self._slots = threading.BoundedSemaphore(workers)

    @property
    def name(self) -> str:
        return str(self._schema.get("function", {}).get("name", "code_interpreter"))

    @property
    def schema(self) -> Mapping[str, Any]:
        return self._schema

    def prepare(self, code: str) -> str:
        """The code actually run; subclasses rewrite it (``ReTool`` prints the last expression)."""
        return code

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        problem = argument_error(self._schema, arguments)
        if problem is not None:
            return ToolResult(f"Error: {problem}", ok=False)
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult(f"Error: tool {self.name!r} needs a string argument 'code'", ok=False)
        with self._slots:
            result = self._run(self.prepare(code))
        return ToolResult(_format(result), ok=result.ok)

    def _run(self, code: str) -> RunResult:
        if self._url is not None:
            return run_code_on_sandbox_fusion(self._url, code, language=self._language, limits=self._limits)
        return run_python_locally(code, self._limits)


def _format(result: RunResult) -> str:
    """The model sees stdout, then stderr (tracebacks, limit messages) when there is any."""
    text = result.stdout
    if result.stderr.strip():
        text = f"{text}\n{result.stderr}" if text else result.stderr
    return text if text.strip() else "(no output)"
