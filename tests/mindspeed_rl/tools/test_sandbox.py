"""The local code sandbox really runs code in a limited child process: timeouts, memory, network,
children that would outlive the call, and the scratch directory."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import (
    SandboxLimits,
    network_namespace_available,
    run_code_on_sandbox_fusion,
    run_python_locally,
)
from tests.support.cli_runs import survivors

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "run code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
# Network isolation needs unprivileged user namespaces; tests that do not check it opt out so
# they run everywhere, and the isolation test is skipped (with the reason) where the OS lacks it.
LIMITS = SandboxLimits(timeout_s=10, memory_limit_mb=512, isolate_network=False)


def test_runs_code_and_returns_its_output() -> None:
    result = run_python_locally("import math\nprint(math.factorial(10))", LIMITS)
    assert result.ok and result.stdout.strip() == "3628800"


def test_a_crash_is_a_failed_result_with_its_traceback() -> None:
    result = run_python_locally("1/0", LIMITS)
    assert not result.ok and result.return_code == 1
    assert "ZeroDivisionError" in result.stderr


def test_sleeping_past_the_timeout_is_killed() -> None:
    limits = SandboxLimits(timeout_s=1, memory_limit_mb=512, isolate_network=False)
    result = run_python_locally("import time\ntime.sleep(60)\nprint('woke')", limits)
    assert result.status == "TimeLimitExceeded" and not result.ok
    assert "woke" not in result.stdout and "exceeded 1 s" in result.stderr


def test_allocating_past_the_memory_limit_fails() -> None:
    limits = SandboxLimits(timeout_s=10, memory_limit_mb=256, isolate_network=False)
    result = run_python_locally("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')", limits)
    assert not result.ok and "MemoryError" in result.stderr and "allocated" not in result.stdout
    # The same allocation well under the limit succeeds: the limit, not the code, stopped it.
    assert run_python_locally("x = bytearray(64 * 1024 * 1024)\nprint('allocated')", limits).ok


def test_children_do_not_outlive_the_call() -> None:
    # The child would sleep far past the wait below: were it left running, survivors() names it.
    child = "import time; time.sleep(600)"
    code = (
        "import subprocess, sys\n"
        f"print(subprocess.Popen([sys.executable, '-c', {child!r}]).pid)\nprint('parent done')\n"
    )
    result = run_python_locally(code, LIMITS)
    assert result.ok and "parent done" in result.stdout, result.stderr
    (pid,) = (int(line) for line in result.stdout.split() if line.isdigit())
    assert survivors({pid}, grace_s=60) == []


def test_runs_in_a_scratch_dir_that_is_removed() -> None:
    result = run_python_locally("import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())", LIMITS)
    scratch = Path(result.stdout.strip())
    assert result.ok and scratch.name.startswith("msrl-sandbox-")
    assert not scratch.exists()


def test_environment_is_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSRL_SECRET_TOKEN", "leak")
    result = run_python_locally("import os\nprint(sorted(os.environ))", LIMITS)
    assert "MSRL_SECRET_TOKEN" not in result.stdout


def test_output_is_capped() -> None:
    limits = SandboxLimits(timeout_s=10, memory_limit_mb=512, max_output_bytes=1000, isolate_network=False)
    result = run_python_locally("print('y' * 100000)", limits)
    assert len(result.stdout) < 1100 and not result.ok


@pytest.mark.skipif(not network_namespace_available(), reason="unprivileged user namespaces are off here")
def test_no_network_inside_the_sandbox() -> None:
    code = (
        "import socket\n"
        "s = socket.socket()\n"
        "s.settimeout(3)\n"
        "print('connect', s.connect_ex(('1.1.1.1', 53)))\n"
        "print([n for _, n in socket.if_nameindex()])\n"
    )
    result = run_python_locally(code, SandboxLimits(timeout_s=10, memory_limit_mb=512))
    assert result.ok, result.stderr
    connect, interfaces = result.stdout.strip().splitlines()
    assert connect != "connect 0"
    assert interfaces == "['lo']"  # a fresh namespace: loopback only


def test_retool_prints_the_last_expression_and_reads_fences() -> None:
    tool = ReTool({"isolate_network": False, "default_timeout": 10}, SCHEMA)
    assert tool.execute({"code": "x = 6\nx * 7"}).text.strip() == "42"
    fenced = tool.execute({"code": "```python\nprint(2 ** 10)\n```"})
    assert fenced.ok and fenced.text.strip() == "1024"


def test_tool_answers_bad_arguments_with_an_error() -> None:
    tool = ReTool({"isolate_network": False}, SCHEMA)
    missing = tool.execute({})
    assert not missing.ok and "missing required" in missing.text
    wrong = tool.execute({"code": 5})
    assert not wrong.ok and "must be a JSON string" in wrong.text


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """Speaks SandboxFusion's run_code shapes; records what it was sent."""

    received: list[dict[str, object]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append(body)
        answer = {
            "status": "Success",
            "message": "",
            "run_result": {
                "status": "Finished",
                "return_code": 0,
                "stdout": "remote 42\n",
                "stderr": "",
                "execution_time": 0.01,
            },
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fusion_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()


def test_sandbox_fusion_url_posts_run_code(fusion_url: str) -> None:
    # A stand-in HTTP server, not SandboxFusion itself (not installable here): it checks the request
    # shape the client sends and that the client reads SandboxFusion's response shape.
    _FakeSandboxFusion.received.clear()
    tool = ReTool({"sandbox_fusion_url": fusion_url, "memory_limit_mb": 300, "default_timeout": 7}, SCHEMA)
    result = tool.execute({"code": "6 * 7"})
    assert result.ok and result.text.strip() == "remote 42"
    (sent,) = _FakeSandboxFusion.received
    assert sent == {"code": "print(6 * 7)", "language": "python", "run_timeout": 7.0, "memory_limit_MB": 300}


def test_unreachable_sandbox_fusion_is_an_error_text() -> None:
    result = run_code_on_sandbox_fusion(
        "http://127.0.0.1:9/run_code", "print(1)", language="python", limits=SandboxLimits(timeout_s=1)
    )
    assert result.status == "SandboxError" and "did not answer" in result.stderr


def test_pid_is_not_leaked_to_caller_env() -> None:
    # The sandbox never runs in the caller's process: its pid differs.
    result = run_python_locally("import os\nprint(os.getpid())", LIMITS)
    assert int(result.stdout) != os.getpid()


def test_retool_leaves_a_last_statement_alone() -> None:
    tool = ReTool({"isolate_network": False}, SCHEMA)
    assert tool.prepare("x = 1") == "x = 1"
    assert tool.prepare("raise ValueError('bad')") == "raise ValueError('bad')"
    assert tool.prepare("x = 2\nx + 1\n") == "x = 2\nprint(x + 1)\n"
