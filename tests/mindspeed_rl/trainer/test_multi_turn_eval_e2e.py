"""Held-out evaluation with tools, and the sandbox server the run starts and stops, in one small
async CLI run shared by every assertion (issue #37).

Real run: CLI, Ray, two HF-engine generation actors, the trainer; the code tool's
``sandbox_fusion_url`` is a local port nobody listens on, so the run starts
``cli/sandbox_server.py`` there and stops it at the end. The test-only parser
(``fault_tools.CallEveryTurn``) makes every turn a well-formed call (a random-init model calls
as often as a trained one), so each held-out trajectory makes exactly ``max_tool_calls`` calls.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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
MAX_TOOL_CALLS = 2


@dataclass(frozen=True)
class EvalRun:
    proc: subprocess.CompletedProcess[str]
    url: str
    port: int
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> EvalRun:
    tmp = tmp_path_factory.mktemp("multi_turn_eval")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"http://127.0.0.1:{port}/run_code"
    tools = tmp / "tools.yaml"
    tools.write_text(
        "tools:\n"
        "  - class_name: mindspeed_rl.tools.retool.ReTool\n"
        "    config:\n"
        f"      sandbox_fusion_url: {url}\n"
        f"      isolate_network: {str(network_namespace_available()).lower()}\n"
        "      num_workers: 4\n"
        "      default_timeout: 10\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: python\n"
        "        parameters: {type: object, properties: {code: {type: string}}, required: [code]}\n"
    )
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_tools_asp",
        f"run_dir={tmp / 'runs'}", f"megatron_training.tokenizer_name_or_path={tmp / 'model'}",
        "warmup_config.enabled=false", "rl_config.rollout_backend=hf",
        "megatron_training.train_iters=4", "megatron_training.global_batch_size=4",
        "megatron_training.split='80,20,0'", "megatron_training.eval_interval=2",
        "megatron_training.eval_iters=1",
        "rl_config.mini_batch_size=4", "rl_config.n_samples_per_prompt=4",
        "actor_config.micro_batch_size=16", "rl_config.actor_forward_micro_batch_size=16",
        "rl_config.ref_forward_micro_batch_size=16",
        "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=1000",
        "async_config.queue_max_samples=24", "async_config.queue_resume_samples=12",
        "async_config.gu_queue_low=1", "async_config.gu_queue_high=2",
        "generate_config.sampling_config.max_tokens=6", "rl_config.max_total_response_length=96",
        f"rl_config.max_tool_calls={MAX_TOOL_CALLS}", f"rl_config.tool_config_path={tools}",
        "rl_config.tool_parser_format=mindspeed_rl.tools.fault_tools.CallEveryTurn",
        "rl_config.use_tensorboard=false",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900, env=shared_cluster_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((tmp / "runs").iterdir())
    return EvalRun(
        proc=proc, url=url, port=port,
        summary=json.loads((run_dir / "summary.json").read_text()),
        metrics=read_metrics(run_dir / "metrics.jsonl"),
    )  # fmt: skip


def test_held_out_prompts_are_decoded_as_trajectories_with_the_tools(eval_run: EvalRun) -> None:
    evaluations = [m for m in eval_run.metrics if "eval/accuracy" in m]
    assert [m["iteration"] for m in evaluations] == [1, 3]
    for m in evaluations:
        # Every turn calls, so each held-out trajectory makes max_tool_calls calls, all answered
        # by the sandbox server the run started.
        assert m["eval/tools/calls_per_sample"] == MAX_TOOL_CALLS
        assert m["eval/tools/calling_fraction"] == 1.0 and m["eval/tools/ok_call_fraction"] == 1.0
        assert m["eval/tools/turns_per_sample"] >= MAX_TOOL_CALLS
        assert m["eval/num_samples"] == m["eval/num_prompts"] * 4


def test_the_run_started_the_local_sandbox_server_and_stopped_it(eval_run: EvalRun) -> None:
    log = eval_run.proc.stdout + eval_run.proc.stderr
    assert f"started the embedded sandbox server at {eval_run.url}" in log
    assert f"stopped the embedded sandbox server at {eval_run.url}" in log
    assert not listening("127.0.0.1", eval_run.port)
    assert eval_run.summary["prompts_consumed_unique_total"] == eval_run.summary["prompts_scheduled"] == 16
