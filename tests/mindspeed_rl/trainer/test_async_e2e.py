"""The async pipeline end to end: real CLI, real Ray, tiny model; invariants read back from the run.

Two runs with vLLM engines, each read by several tests: the shipped demo (module-scoped
``demo_run``: the pipeline's invariants and the reward's rise) and a partial-rollout run shared with
test_real_checkpoints_e2e (session-scoped ``partial_qwen25_run``); fault runs on the light HF
engine. Faults are injected through the trainer's test hook (``MINDSPEED_RL_TEST_FAULTS``): the
process calls ``os._exit``, hangs or raises where the hook says.

Two fault runs carry every fault kind, several per run, each kind checked by its own test on the
run that injected it (module-scoped fixtures):

* ``unit_faults`` (2 GUs x 2 actors): GU 0 exits after forwarding one completion, and actor 0 of
  GU 1 exits in its first minibatch (its GU carries on with actor 1 meanwhile);
* ``actor_faults`` (1 GU x 1 actor): the actor hangs in its third minibatch and raises in its
  fifth, exits in its first evaluation decode and hangs in its third.

Each fault that hits a minibatch re-queues that minibatch (a ``MinibatchRequeued`` with the
fault's reason); a fault in an evaluation decode re-queues none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.fault_hooks import FAULTS_ENV
from mindspeed_rl.utils.metrics import read_metrics
from mindspeed_rl.utils.run_summary import REQUIRED_KEYS
from tests.support.cli_runs import CliRun
from tests.support.cli_runs import run_cli as shared_cli
from tests.support.models import PolicyModels
from tests.support.ray_cluster import shared_cluster_env
from tests.support.shared_runs import (
    PARTIAL_QWEN25_ITERS,
    PARTIAL_QWEN25_PROMPTS,
    PARTIAL_QWEN25_SAMPLES,
    PARTIAL_QWEN25_SPLIT,
)

ROOT = Path(__file__).resolve().parents[3]
# The shipped demo (builtin:demo_short, 200-step warm-up, 40 iterations) measured +0.22, +0.22, +0.22
# (reward, first 5 -> last 5) and +0.25, +0.26, +0.18 (held-out accuracy, first -> last evaluation)
# on a shared 2-core host. The reward bound is issue #23's target; the previous demo settings
# (builtin:demo, 400-step warm-up) measured +0.04 and a 100-step warm-up +0.09, and both fail it.
DEMO_REWARD_RISE = 0.15
DEMO_EVAL_RISE = 0.10
pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 4 iterations x 4 prompts; minibatches of 2 prompts (8 of them), batch groups of 2.
TINY = (
    "megatron_training.train_iters=4",
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.n_samples_per_prompt=4",
    "actor_config.micro_batch_size=16",
    "rl_config.actor_forward_micro_batch_size=16",
    "rl_config.ref_forward_micro_batch_size=16",
    "warmup_config.steps=5",
    "asp_config.b=2",
    "asp_config.kappa=0",
    "asp_config.k=2",
    "asp_config.sa_iterations=1000",
    "async_config.queue_max_samples=24",
    "async_config.queue_resume_samples=12",
    "async_config.gu_queue_low=1",
    "async_config.gu_queue_high=2",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.use_tensorboard=false",
)
HF = ("rl_config.rollout_backend=hf",)


def run_cli(tmp_path: Path, *overrides: str, faults: str = "") -> Path:
    proc = run_cli_process(tmp_path, *overrides, faults=faults)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return run_dir


def run_cli_process(
    tmp_path: Path, *overrides: str, faults: str = "", timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        str(ROOT / "cli" / "train_grpo.py"),
        "--config-name",
        "grpo_tiny_asp",
        f"run_dir={runs}",
        f"megatron_training.tokenizer_name_or_path={tmp_path / 'model'}",
        *TINY,
        *overrides,
    ]
    env = {**shared_cluster_env(), FAULTS_ENV: faults}  # the driver exits; it is never killed here
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return summary, read_metrics(run_dir / "metrics.jsonl"), events


def check_exactly_once(summary: dict[str, Any], *, prompts: int = 16) -> None:
    assert set(REQUIRED_KEYS) <= set(summary)
    assert summary["pipeline"] == "async"
    assert summary["prompts_scheduled"] == summary["prompts_consumed"] == prompts
    assert summary["duplicate_minibatches_dropped"] == 0
    assert summary["max_policy_lag_measured"] <= summary["max_policy_lag_limit"]
    # The queue's provable worst case holds (Q_max + one largest minibatch per actor).
    assert summary["max_queue_depth_samples"] <= summary["queue_bound_samples"]


def check_reload_discipline(events: list[dict[str, Any]]) -> int:
    """Per actor: each start uses the version of its latest reload (0 before any), reloads only
    between a completion and the next start, versions only go up, always the newest known."""
    version: dict[tuple[int, int], int] = defaultdict(int)
    running: dict[tuple[int, int], int] = {}
    num_reloads = 0
    for e in events:
        key = (e.get("gu_id"), e.get("actor_id"))
        if e["event"] == "ActorFaulted":  # a replacement starts from the initial weights
            version[key] = 0
            running.pop(key, None)
        elif e["event"] == "WeightsLoaded":
            assert key not in running, f"actor {key} reloaded while running minibatch {running.get(key)}"
            assert e["version"] > version[key] and e["version"] >= e["newest_at_start"]
            version[key] = e["version"]
            num_reloads += 1
        elif e["event"] == "MinibatchStarted":
            assert e["policy_version"] == version[key]
            running[key] = e["minibatch_id"]
        elif e["event"] == "MinibatchReceived" and e["outcome"] == "accepted":
            assert running.pop(key) == e["minibatch_id"]
        elif e["event"] == "MinibatchRequeued" and e["actor_id"] is not None:
            running.pop(key, None)
    return num_reloads


def check_pipeline_invariants(
    run_dir: Path, *, iterations: int, prompts: int, in_flight: int
) -> dict[str, Any]:
    """What every async run on vLLM must show: each prompt consumed once, the lag and queue bounds
    held, reloads only between minibatches and always to the newest version, no minibatch
    re-issued, the control plane's CPU accounted, and every per-step metric written. ``in_flight``:
    what the minibatches running when a pause began can still add to the queue (GUs x actors x
    prompts per minibatch x samples per prompt). Returns the summary."""
    summary, records, events = load_run(run_dir)
    check_exactly_once(summary, prompts=prompts)
    assert summary["prompts_consumed_unique_total"] == summary["prompts_consumed_total"] == prompts
    assert summary["minibatches_reissued"] == 0 and summary["reloads_not_newest"] == 0
    # The control plane's CPU is accounted (it competes with the engines on small hosts).
    assert summary["cu_cpu_seconds"] > 0 and summary["gu_control_cpu_seconds"] > 0
    assert summary["control_plane_cores"] == pytest.approx(
        (summary["cu_cpu_seconds"] + summary["gu_control_cpu_seconds"]) / summary["pipeline_seconds"]
    )
    # Queue bound: Q_max plus what the minibatches running when the pause began can still add.
    assert summary["max_queue_depth_samples"] <= summary["queue_limit_samples"] + in_flight
    assert check_reload_discipline(events) > 0
    assert [r["iteration"] for r in records] == list(range(iterations))
    per_step = (
        "iteration_time_s", "tokens_per_s", "time/trainer_wait_s", "queue/depth_samples_max",
        "backpressure/seconds_paused", "lag/d_off_mean", "lag/d_off_max", "duty_cycle_mean",
    )  # fmt: skip
    for key in per_step:
        assert all(isinstance(r.get(key), int | float) for r in records), key
    for key in ("lag/d_off_eq4", "snapshot/save_s", "snapshot/convert_s", "snapshot/load_s"):
        assert any(key in r for r in records), key
    assert all(0 <= r["lag/d_off_max"] <= summary["max_policy_lag_limit"] for r in records)
    assert all(r["lag/oldest_token_max"] <= summary["max_policy_lag_limit"] for r in records)
    assert (run_dir / "final_model" / "model.safetensors").is_file()
    assert (run_dir / "asp_schedule.json").is_file()
    return summary


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoRun:
    run: CliRun
    # The shipped config's: iterations, prompts per iteration, and what can be in flight when a
    # pause begins (GUs x actors x prompts per minibatch x samples per prompt).
    iterations: int
    prompts_per_iteration: int
    in_flight: int


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``make demo`` as shipped (``grpo_tiny_asp``: 2 GUs x 2 vLLM actors, its own warm-up), read
    by the invariants test and the reward test."""
    from mindspeed_rl.config_cls import load_config_from_files

    config = load_config_from_files(ROOT / "configs", "grpo_tiny_asp")
    workdir = tmp_path_factory.mktemp("demo")
    run = shared_cli(workdir, "grpo_tiny_asp", ("rl_config.use_tensorboard=false",))
    training, layout = config.megatron_training.training, config.async_config
    return DemoRun(
        run=run,
        iterations=training.train_iters,
        prompts_per_iteration=training.global_batch_size,
        in_flight=layout.num_generation_units
        * layout.actors_per_unit
        * config.asp_config.b
        * config.rl_config.n_samples_per_prompt,
    )


@pytest.mark.vllm
def test_async_run_with_vllm_meets_the_pipeline_invariants(demo_run: DemoRun) -> None:
    """The shipped demo's run (2 GUs x 2 vLLM actors, 40 iterations of 32 prompts, minibatches of
    8 prompts x 8 samples) meets every invariant of the pipeline."""
    check_pipeline_invariants(
        demo_run.run.run_dir,
        iterations=demo_run.iterations,
        prompts=demo_run.iterations * demo_run.prompts_per_iteration,
        in_flight=demo_run.in_flight,
    )
    records = read_metrics(demo_run.run.run_dir / "metrics.jsonl")
    assert any("gen/gu1/minibatches" in r for r in records)  # both GUs report


@pytest.mark.vllm
def test_partial_rollouts_with_vllm_meet_the_pipeline_invariants(partial_qwen25_run: CliRun) -> None:
    """Partial rollouts on (N = 3, rounds of 3 tokens; ``shared_runs.PARTIAL_QWEN25``, whose run
    test_real_checkpoints_e2e also reads): the invariants hold with them as without, some responses
    cross a refresh (2 or 3 segments each), and the lag counts from the oldest token."""
    run_dir = partial_qwen25_run.run_dir
    summary = check_pipeline_invariants(
        run_dir,
        iterations=PARTIAL_QWEN25_ITERS,
        prompts=PARTIAL_QWEN25_ITERS * PARTIAL_QWEN25_PROMPTS,
        in_flight=1 * 1 * 2 * PARTIAL_QWEN25_SAMPLES,
    )
    assert summary["partial_samples_total"] > 0
    assert 2 * summary["partial_samples_total"] <= summary["partial_segments_total"]
    assert summary["partial_segments_total"] <= PARTIAL_QWEN25_SPLIT * summary["partial_samples_total"]
    assert 2 <= summary["max_segments_per_sample"] <= PARTIAL_QWEN25_SPLIT


# One entry per fault kind: the shared run that injects it (a fixture below), the GU and actor it
# hits, and the reason of the re-queue it causes.
FAULTS = {
    # A generation actor killed during its first minibatch: its GU carries on with its other actor.
    "actor": dict(run="unit_faults", reason="actor_failed", gu_id=1, actor_id=0, counted="actor_deaths"),
    # A whole GU killed after forwarding one completion: the other GU takes over its work, and the
    # evaluations the dead GU was given (GU 0 gets each first).
    "gu": dict(run="unit_faults", reason="gu_failed", gu_id=0, actor_id=None, counted=None),
    # The only actor hangs in its third minibatch: killed at the timeout, replaced, re-issued.
    "hang": dict(
        run="actor_faults", reason="actor_timeout", gu_id=0, actor_id=0, counted="minibatches_timed_out"
    ),
    # The only actor raises in its fifth minibatch: replaced, the minibatch re-issued.
    "raise": dict(run="actor_faults", reason="actor_error", gu_id=0, actor_id=0, counted="minibatch_errors"),
}
# The layouts and fault plans of the shared runs; actor_faults' one slot is replaced four times
# (two minibatch faults, two evaluation faults), one more than the default allows.
FAULT_RUNS = {
    "unit_faults": dict(layout=(2, 2), faults="gu:0:1,actor:1:0:1", extra=()),
    "actor_faults": dict(
        layout=(1, 1),
        faults="hang:0:0:3,raise:0:0:5,eval-exit:0:0:1,eval-hang:0:0:3",
        extra=("async_config.actor_max_restarts=4",),
    ),
}
# A hang is detected in seconds here; the stall detector stays well above it. The clock starts when
# an actor starts the minibatch (a replacement's start-up is outside it), and these minibatches and
# evaluation decodes take 0.04-0.08 s on the HF engine (events.jsonl, generation_seconds): 6 s is
# about 75 times that. Each of actor_faults' two hangs waits the whole bound (it was 20 s).
FAULT_TIMEOUTS = ("async_config.minibatch_timeout_s=6", "async_config.stall_timeout_s=120")
# An evaluation after every iteration: the faults must not lose one either.
EVAL_EVERY_STEP = ("megatron_training.eval_interval=1", "megatron_training.eval_iters=1")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRun:
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]

    def requeued(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "MinibatchRequeued"]

    def faulted(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "ActorFaulted"]


def _fault_run(name: str, tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> FaultRun:
    spec: dict[str, Any] = FAULT_RUNS[name]
    gus, actors = spec["layout"]
    workdir = tmp_path_factory.mktemp(name)
    policy_models.provide(workdir / "model", "grpo_tiny_asp", TINY)
    run_dir = run_cli(
        workdir,
        *HF,
        f"async_config.num_generation_units={gus}",
        f"async_config.actors_per_unit={actors}",
        *FAULT_TIMEOUTS,
        *EVAL_EVERY_STEP,
        *spec["extra"],
        faults=spec["faults"],
    )
    summary, records, events = load_run(run_dir)
    return FaultRun(summary=summary, records=records, events=events)


@pytest.fixture(scope="module")
def unit_faults(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> FaultRun:
    return _fault_run("unit_faults", tmp_path_factory, policy_models)


@pytest.fixture(scope="module")
def actor_faults(tmp_path_factory: pytest.TempPathFactory, policy_models: PolicyModels) -> FaultRun:
    return _fault_run("actor_faults", tmp_path_factory, policy_models)


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_killed_unit_loses_and_duplicates_nothing(request: pytest.FixtureRequest, kind: str) -> None:
    fault: dict[str, Any] = FAULTS[kind]
    run: FaultRun = request.getfixturevalue(fault["run"])
    summary, records, events = run.summary, run.records, run.events
    check_exactly_once(summary)
    assert [r.get("eval/weights_version") for r in records] == [1.0, 2.0, 3.0, 4.0]
    # Every re-queue is one of this run's faults; this kind's re-queued what it hit, on its unit.
    in_run = {FAULTS[k]["reason"] for k in FAULTS if FAULTS[k]["run"] == fault["run"]}
    assert {e["reason"] for e in run.requeued()} == in_run
    requeued = [e for e in run.requeued() if e["reason"] == fault["reason"]]
    assert requeued and all(e["gu_id"] == fault["gu_id"] for e in requeued)
    assert summary["minibatches_reissued"] >= len({e["minibatch_id"] for e in run.requeued()})
    received = [e for e in events if e["event"] == "MinibatchReceived" and e["outcome"] == "accepted"]
    accepted = {e["minibatch_id"] for e in received}
    assert len(accepted) == len(received) == 8  # every minibatch once, the re-issued ones included
    assert {e["minibatch_id"] for e in requeued} <= accepted
    if kind == "gu":
        assert sum(e["gu_id"] == 0 for e in received) == 1  # exactly what GU 0 forwarded before dying
    else:
        assert all(e["actor_id"] == fault["actor_id"] for e in requeued)
        # This kind's fault: one actor fault of its kind on its slot, the actor replaced.
        kind_of = {"actor": "died", "hang": "timeout", "raise": "error"}[kind]
        hit = [e for e in run.faulted() if e["kind"] == kind_of and _requeued_by(run, e)]
        assert [(e["gu_id"], e["actor_id"], e["replaced"]) for e in hit] == [
            (fault["gu_id"], fault["actor_id"], True)
        ]
        assert summary[fault["counted"]] == 1
        # Every actor fault of the run replaced its actor (none was a retirement).
        assert summary["actor_restarts"] == len(run.faulted()) and all(e["replaced"] for e in run.faulted())
    check_reload_discipline(events)


def _requeued_by(run: FaultRun, fault: dict[str, Any]) -> bool:
    """Whether actor fault event ``fault`` re-queued a minibatch: the Control Unit logs the
    re-queue right after the fault, for the same actor."""
    index = run.events.index(fault)
    following = run.events[index + 1] if index + 1 < len(run.events) else {}
    return following.get("event") == "MinibatchRequeued" and (following["gu_id"], following["actor_id"]) == (
        fault["gu_id"],
        fault["actor_id"],
    )


def test_an_evaluation_outlives_an_actor_dying_and_one_hanging_in_its_decode(actor_faults: FaultRun) -> None:
    """The only actor exits in its first evaluation decode and hangs in its third (the second
    evaluation's first try): each time the GU replaces it, the replacement reloads the evaluated
    snapshot and decodes the job again; every evaluation lands, and no prompt is lost or repeated.
    Its run (``actor_faults``) also hangs and raises in two minibatches: those re-queue their
    minibatch, the evaluation faults none."""
    summary, records = actor_faults.summary, actor_faults.records
    check_exactly_once(summary)
    evaluated = [r for r in records if "eval/accuracy" in r]
    assert [(r["iteration"], r["eval/weights_version"]) for r in evaluated] == [
        (0, 1.0),
        (1, 2.0),
        (2, 3.0),
        (3, 4.0),
    ]
    assert all(r["eval/num_samples"] == r["eval/num_prompts"] * 4 > 0 for r in evaluated)
    in_eval = [
        (e["kind"], e["replaced"]) for e in actor_faults.faulted() if not _requeued_by(actor_faults, e)
    ]
    assert in_eval == [("died", True), ("timeout", True)]
    # The actor held no minibatch while decoding: only the two minibatch faults re-queued one each.
    assert sorted(e["reason"] for e in actor_faults.requeued()) == ["actor_error", "actor_timeout"]
    assert summary["actor_restarts"] == 4 and summary["minibatches_reissued"] == 2
    # 4 evaluations, 2 of them decoded twice (failed + retried).
    assert summary["gu_calls"]["actor.decode_held_out"] == 4 + 2


def test_a_minibatch_failing_every_attempt_stops_the_run_naming_it(
    tmp_path: Path, policy_models: PolicyModels
) -> None:
    """``raise:0:0:*``: the one actor raises on every minibatch; after minibatch_max_attempts the
    run ends with an error naming the minibatch and its prompts, not a hang or a cascade."""
    policy_models.provide(tmp_path / "model", "grpo_tiny_asp", TINY)
    proc = run_cli_process(
        tmp_path,
        *HF,
        "async_config.num_generation_units=1",
        "async_config.actors_per_unit=1",
        *FAULT_TIMEOUTS,
        faults="raise:0:0:*",
        timeout=400,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "PoisonedMinibatch" in out and "failed all 3 attempts" in out, out[-4000:]
    assert "its prompts [" in out and "raised on minibatch" in out


@pytest.mark.vllm
def test_async_demo_reward_rises(demo_run: DemoRun) -> None:
    """``make demo`` as shipped (2 GUs x 2 vLLM actors): GRPO must learn, visibly, and the run
    must end by saying so (the end-of-run block) with its plots written."""
    run_dir, out = demo_run.run.run_dir, demo_run.run
    records = read_metrics(run_dir / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in records]
    assert len(rewards) == demo_run.iterations
    # Per-iteration rewards swing by +-0.1 with the batch's length mix; the means of 5 do not.
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + DEMO_REWARD_RISE, f"reward did not rise: first 5 {first:.3f}, last 5 {last:.3f}"
    evals = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    assert len(evals) >= 2 and evals[-1] > evals[0] + DEMO_EVAL_RISE, (
        f"held-out accuracy did not rise: {evals}"
    )
    assert f"== run finished: {run_dir}" in out.stdout and "eval accuracy" in out.stdout
    assert {p.name for p in (run_dir / "plots").glob("*.png")} >= {
        "reward.png",
        "eval_accuracy.png",
        "lag.png",
    }
    # Quiet by default: none of the per-reload engine lines reach the console.
    assert "Failed to load weights" not in out.stderr and "reset prefix cache" not in out.stderr
