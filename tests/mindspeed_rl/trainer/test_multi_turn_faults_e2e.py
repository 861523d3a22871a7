"""Multi-turn fault run (issue #37): a tool that hangs, a call that crashes the sandbox server and a
generation actor killed mid-trajectory, in one async CLI run shared by every assertion.

The run is real (CLI, Ray, two HF-engine generation actors, the trainer, ``cli/sandbox_server.py``
as the code tool's SandboxFusion endpoint, started by the run itself because the tool's URL is
local and nothing listens there); the tool and parser are the test-only ones of
``mindspeed_rl.tools.fault_tools``: every turn calls the tool (a random-init model then calls as
often as a trained one), and each fault fires once, at a fixed call number of whichever actor
gets there first: the hang and the server crash in an actor's first minibatch (16 calls: 2
prompts x 4 samples x 2 calls), the exit in its third, so the hung call's trajectory is trained on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.tools.embedded_servers import listening
from mindspeed_rl.tools.sandbox import network_namespace_available
from mindspeed_rl.utils.metrics import read_metrics
from tests.support.ray_cluster import shared_cluster_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
PROMPTS = 16
CALL_TIMEOUT_S = 3


@dataclass(frozen=True)
class FaultRun:
    proc: subprocess.CompletedProcess[str]
    run_dir: Path
    markers: Path
    url: str
    port: int
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]


def _tool_yaml(path: Path, url: str, markers: Path) -> None:
    path.write_text(
        "tools:\n"
        "  - class_name: mindspeed_rl.tools.fault_tools.FaultyCodeTool\n"
        "    config:\n"
        f"      sandbox_fusion_url: {url}\n"
        # Where the OS has no unprivileged user namespaces the embedded server must be told to
        # run code with network access (it refuses otherwise).
        f"      isolate_network: {str(network_namespace_available()).lower()}\n"
        "      num_workers: 4\n"
        "      default_timeout: 5\n"
        f"      marker_dir: {markers}\n"
        "      hang_at: 2\n"
        "      crash_server_at: 8\n"
        "      exit_actor_at: 40\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: python\n"
        "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
    )


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRun]:
    tmp = tmp_path_factory.mktemp("multi_turn_faults")
    markers = tmp / "markers"
    markers.mkdir()
    with socket.socket() as s:  # a local port nobody listens on: the run starts the server there
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}/run_code"
    tools = tmp / "tools.yaml"
    _tool_yaml(tools, url, markers)
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_tools_asp",
        f"run_dir={tmp / 'runs'}", f"megatron_training.tokenizer_name_or_path={tmp / 'model'}",
        "warmup_config.enabled=false", "rl_config.rollout_backend=hf",
        "megatron_training.train_iters=4", "megatron_training.global_batch_size=4",
        "rl_config.mini_batch_size=4", "rl_config.n_samples_per_prompt=4",
        "actor_config.micro_batch_size=16", "rl_config.actor_forward_micro_batch_size=16",
        "rl_config.ref_forward_micro_batch_size=16",
        "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=1000",
        "async_config.queue_max_samples=24", "async_config.queue_resume_samples=12",
        "async_config.gu_queue_low=1", "async_config.gu_queue_high=2",
        "generate_config.sampling_config.max_tokens=6", "rl_config.max_total_response_length=96",
        "rl_config.max_tool_calls=2", f"rl_config.tool_config_path={tools}",
        "rl_config.tool_parser_format=mindspeed_rl.tools.fault_tools.CallEveryTurn",
        f"rl_config.tool_call_timeout={CALL_TIMEOUT_S}", "rl_config.use_tensorboard=false",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900, env=shared_cluster_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((tmp / "runs").iterdir())
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    yield FaultRun(
        proc=proc, run_dir=run_dir, markers=markers, url=url, port=port,
        summary=json.loads((run_dir / "summary.json").read_text()),
        metrics=read_metrics(run_dir / "metrics.jsonl"), events=events,
    )  # fmt: skip


def test_every_fault_fired(fault_run: FaultRun) -> None:
    assert sorted(p.name for p in fault_run.markers.iterdir()) == [
        "crash_server_at",
        "exit_actor_at",
        "hang_at",
    ]
    # The sandboxed code killed the server the run had started; the run noticed at its end.
    log = fault_run.proc.stdout + fault_run.proc.stderr
    assert f"the embedded sandbox server at {fault_run.url} had exited during the run" in log


def test_the_run_started_the_local_sandbox_server_and_stopped_it(fault_run: FaultRun) -> None:
    log = fault_run.proc.stdout + fault_run.proc.stderr
    assert f"started the embedded sandbox server at {fault_run.url}" in log
    server_log = fault_run.run_dir / "servers" / f"sandbox_server_{fault_run.port}.log"
    assert server_log.read_text().startswith(f"sandbox server on {fault_run.url}")
    assert not listening("127.0.0.1", fault_run.port)


def test_the_run_completes_with_every_prompt_consumed_once(fault_run: FaultRun) -> None:
    s = fault_run.summary
    assert [m["iteration"] for m in fault_run.metrics] == [0, 1, 2, 3]
    assert s["prompts_scheduled"] == s["prompts_consumed"] == PROMPTS
    assert s["prompts_consumed_unique_total"] == s["prompts_consumed_total"] == PROMPTS
    assert s["duplicate_minibatches_dropped"] == 0
    consumed = [
        json.loads(x) for x in (fault_run.run_dir / "prompts_consumed.jsonl").read_text().splitlines()
    ]
    assert len(consumed) == len({json.dumps(c, sort_keys=True) for c in consumed})


def test_the_killed_actor_is_replaced_and_its_minibatch_reissued(fault_run: FaultRun) -> None:
    assert fault_run.summary["actor_deaths"] == 1 and fault_run.summary["actor_restarts"] == 1
    requeued = [e for e in fault_run.events if e["event"] == "MinibatchRequeued"]
    assert [e["reason"] for e in requeued] == ["actor_failed"]


def test_hung_and_failed_calls_are_tool_errors_not_run_failures(fault_run: FaultRun) -> None:
    tools = fault_run.summary["tools"]
    # Every trajectory made its two calls (the parser calls every turn); after the server died
    # every call was answered with a sandbox error, and the hung one with its timeout.
    assert tools["calls_total"] == 2 * 4 * PROMPTS
    assert 2 <= tools["errors_total"] < tools["calls_total"]
    assert tools["seconds_total"] >= CALL_TIMEOUT_S
