"""The sandbox server through its HTTP API, as a client calls it: ``cli/sandbox_server.py`` started
as its own process, requests in SandboxFusion's shape, and the code tool pointed at it. Code that
sleeps past its timeout, allocates past its limit, opens a socket or leaves children behind is
stopped and answered with an error, and the server goes on serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import network_namespace_available
from mindspeed_rl.tools.sandbox_server import ServerLimits, answer
from tests.support.cli_runs import survivors

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
ISOLATED = network_namespace_available()


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    args = [sys.executable, str(ROOT / "cli" / "sandbox_server.py"), "--port", "0", "--max-memory-mb", "512"]
    if not ISOLATED:
        args.append("--allow-network")  # the network test below is skipped then, saying why
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sandbox server on "), (line, proc.stderr.read() if proc.stderr else "")
        yield line.split(" on ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(url: str, code: str, **extra: object) -> dict[str, object]:
    body = json.dumps({"code": code, "language": "python", **extra}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.loads(response.read()))


def test_runs_code_with_sandbox_fusions_response_shape(server_url: str) -> None:
    out = run(server_url, "print(sum(range(10)))", run_timeout=10)
    assert out["status"] == "Success"
    result = out["run_result"]
    assert isinstance(result, dict)
    assert result["status"] == "Finished" and result["return_code"] == 0 and result["stdout"] == "45\n"


def test_sleeping_past_the_timeout_is_stopped_and_the_server_goes_on(server_url: str) -> None:
    out = run(server_url, "import time\ntime.sleep(30)", run_timeout=1)
    assert out["status"] == "Failed" and out["run_result"]["status"] == "TimeLimitExceeded"  # type: ignore[index]
    assert run(server_url, "print('still here')")["status"] == "Success"


def test_allocating_past_the_limit_fails(server_url: str) -> None:
    out = run(server_url, "x = bytearray(2 * 1024**3)", memory_limit_MB=256)
    assert out["status"] == "Failed" and "MemoryError" in out["run_result"]["stderr"]  # type: ignore[index]


def test_requests_above_the_server_cap_are_held_to_it(server_url: str) -> None:
    # 4 GB asked, 512 MB served (--max-memory-mb): a 1 GB allocation fails.
    out = run(server_url, "x = bytearray(1024**3)", memory_limit_MB=4096)
    assert out["status"] == "Failed"


def test_children_left_behind_are_killed(server_url: str) -> None:
    # Each child would sleep far past the wait below: were one left running, survivors() names it.
    child = "import time; time.sleep(600)"
    code = (
        "import subprocess, sys\n"
        f"for _ in range(5):\n    print(subprocess.Popen([sys.executable, '-c', {child!r}]).pid)\n"
    )
    out = run(server_url, code)
    assert out["status"] == "Success"
    pids = {int(line) for line in out["run_result"]["stdout"].split()}  # type: ignore[index]
    assert len(pids) == 5 and survivors(pids, grace_s=60) == []


@pytest.mark.skipif(not ISOLATED, reason="unprivileged user namespaces are off here")
def test_no_network(server_url: str) -> None:
    code = "import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=3)"
    out = run(server_url, code)
    assert out["status"] == "Failed" and "OSError" in out["run_result"]["stderr"]  # type: ignore[index]


def test_bad_requests_are_answered_not_crashed(server_url: str) -> None:
    assert run(server_url, "print(1)", language="cpp")["status"] == "SandboxError"
    request = urllib.request.Request(server_url, data=b"{nope", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    assert run(server_url, "print(2)")["status"] == "Success"


def test_code_tool_against_the_server(server_url: str) -> None:
    tool = ReTool({"sandbox_fusion_url": server_url, "default_timeout": 10}, SCHEMA)
    result = tool.execute({"code": "import os\nos.getpid()"})
    assert result.ok and int(result.text) != os.getpid()  # ran in the server's child, not here
    failed = tool.execute({"code": "raise ValueError('bad')"})
    assert not failed.ok and "ValueError: bad" in failed.text


def test_answer_refuses_a_body_without_code() -> None:
    assert answer({"language": "python"}, ServerLimits())["status"] == "SandboxError"


def test_server_refuses_to_start_without_isolation_unless_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on a machine without unprivileged user namespaces (the probe answers no)."""
    import mindspeed_rl.tools.sandbox_server as server_module
    from cli import sandbox_server

    monkeypatch.setattr(server_module, "network_namespace_available", lambda: False)
    assert sandbox_server.main(["--port", "0"]) == 2
    assert "--allow-network" in capsys.readouterr().err
    server = server_module.make_server("127.0.0.1", 0, ServerLimits(isolate_network=False))
    server.server_close()
