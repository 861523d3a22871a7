"""An HTTP server with SandboxFusion's ``run_code`` request and response shapes over the local
sandbox (``sandbox.py``), so model-written code runs in a process tree of its own, away from every
trainer and actor process, and the code tool talks to it as to a SandboxFusion deployment
(``sandbox_fusion_url: http://HOST:PORT/run_code``).

Request (SandboxFusion's fields; others are ignored): ``{"code": str, "language": "python",
"run_timeout": s, "memory_limit_MB": mb}``. Response: ``{"status": "Success" | "Failed" |
"SandboxError", "message": str, "run_result": {"status": "Finished" | "TimeLimitExceeded",
"execution_time": s, "return_code": int | null, "stdout": str, "stderr": str}}``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mindspeed_rl.tools.sandbox import SandboxLimits, network_namespace_available, run_python_locally

MAX_REQUEST_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    """Caps every request is held to, whatever it asks for."""

    max_timeout_s: float = 60.0
    max_memory_mb: int = 2048
    max_output_bytes: int = 64 * 1024
    workers: int = 4
    """Runs at once; further requests wait for a slot."""
    isolate_network: bool = True


def answer(request: Any, limits: ServerLimits) -> dict[str, Any]:
    """The response to one ``run_code`` request body (already JSON-decoded)."""
    if not isinstance(request, dict) or not isinstance(request.get("code"), str):
        return {"status": "SandboxError", "message": 'the request needs a JSON object with a "code" string'}
    language = request.get("language", "python")
    if language != "python":
        return {
            "status": "SandboxError",
            "message": f"language {language!r} is not supported here; use python",
        }
    try:
        timeout = min(float(request.get("run_timeout") or limits.max_timeout_s), limits.max_timeout_s)
        memory = min(int(request.get("memory_limit_MB") or limits.max_memory_mb), limits.max_memory_mb)
        run_limits = SandboxLimits(
            timeout_s=timeout,
            memory_limit_mb=memory,
            max_output_bytes=limits.max_output_bytes,
            isolate_network=limits.isolate_network,
        )
    except (TypeError, ValueError) as exc:
        return {"status": "SandboxError", "message": f"bad run_timeout / memory_limit_MB: {exc}"}
    result = run_python_locally(request["code"], run_limits)
    return {
        "status": "Success" if result.ok else "Failed",
        "message": "",
        "run_result": {
            "status": result.status,
            "execution_time": result.execution_time,
            "return_code": result.return_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
    }


def make_server(host: str, port: int, limits: ServerLimits) -> ThreadingHTTPServer:
    """A bound server (``port`` 0 = any free port); call ``serve_forever`` to run it."""
    if limits.isolate_network and not network_namespace_available():
        raise RuntimeError(
            "the sandbox server cannot give each run its own network namespace here (unprivileged user "
            "namespaces are off); start it with --allow-network to run code with network access"
        )
    if limits.workers < 1:
        raise ValueError(f"workers={limits.workers}; use 1 or more")
    slots = threading.BoundedSemaphore(limits.workers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/run_code":
                self._send(
                    404, {"status": "SandboxError", "message": f"no endpoint {self.path}; use /run_code"}
                )
                return
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_REQUEST_BYTES:
                self._send(
                    413, {"status": "SandboxError", "message": f"request over {MAX_REQUEST_BYTES} bytes"}
                )
                return
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except json.JSONDecodeError as exc:
                self._send(400, {"status": "SandboxError", "message": f"request is not JSON: {exc.msg}"})
                return
            with slots:
                self._send(200, answer(body, limits))

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the run's log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
