"""Upstream's DAPO system-test batch semantics end to end, in both pipelines: generation batches of
global_batch_size 8, a trainer iteration on every filter_groups_train_batch_size 2 kept prompts,
and upstream's mini_batch_size larger than the iteration (one optimizer step each). One run per
pipeline (module-scoped), shared by the assertions; the light HF rollout engine, tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.utils.metrics import read_metrics
from tests.support.ray_cluster import shared_cluster_env

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.slow]
ITERS, GBS, TRAIN, N = 5, 8, 2, 2
TINY = (
    f"megatron_training.train_iters={ITERS}",
    f"megatron_training.global_batch_size={GBS}",
    f"rl_config.filter_groups_train_batch_size={TRAIN}",
    "rl_config.mini_batch_size=32",  # upstream's system test: more than an iteration = one step
    f"rl_config.n_samples_per_prompt={N}",
    "actor_config.micro_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=4",
    "rl_config.ref_forward_micro_batch_size=4",
    "megatron_training.eval_interval=null",
    "asp_config.b=4",
    "asp_config.kappa=0",
    "asp_config.k=2",
    "asp_config.sa_iterations=1000",
    "async_config.num_generation_units=1",
    "async_config.actors_per_unit=1",
    "async_config.queue_max_samples=64",
    "async_config.queue_resume_samples=32",
    "async_config.gu_queue_low=1",
    "async_config.gu_queue_high=2",
    "generate_config.sampling_config.max_tokens=24",
    "rl_config.rollout_max_tokens=24",
    "rl_config.overlong_buffer=8",
    "rl_config.use_tensorboard=false",
    "rl_config.rollout_backend=hf",
    "rl_config.filter_groups_metric=demo",  # partial credit: some groups uniform, most mixed
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dapo_train_batch")


def _run(workdir: Path, pipeline: str) -> dict[str, Any]:
    runs = workdir / pipeline
    cmd = [
        sys.executable, str(ROOT / "cli" / "train_dapo.py"), "--config-name", "dapo_tiny_asp",
        f"run_dir={runs}", f"megatron_training.tokenizer_name_or_path={workdir / 'model'}", *TINY,
        f"rl_config.pipeline={pipeline}",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=900, env=shared_cluster_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (run_dir,) = list(runs.iterdir())
    consumed = [json.loads(line) for line in (run_dir / ckpt.CONSUMED_LOG).read_text().splitlines()]
    return {
        "log": proc.stderr,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "metrics": read_metrics(run_dir / "metrics.jsonl"),
        "consumed": consumed,
    }


@pytest.fixture(scope="module")
def hybrid(workdir: Path) -> dict[str, Any]:
    return _run(workdir, "hybrid")


@pytest.fixture(scope="module")
def asynchronous(workdir: Path, hybrid: dict[str, Any]) -> dict[str, Any]:
    return _run(workdir, "async")  # after the hybrid run: the model folder it built is reused


def _check_every_step_trains_two_kept_prompts(run: dict[str, Any]) -> None:
    metrics = run["metrics"]
    assert [m["iteration"] for m in metrics] == list(range(ITERS))
    for m in metrics:
        assert m["dapo/groups_kept"] == TRAIN and m["num_samples"] == TRAIN * N
        assert m["reward/groups_without_spread"] == 0  # every trained group carries a signal
    assert "trains one iteration on every filter_groups_train_batch_size 2 kept prompts" in run["log"]
    assert "each iteration is one optimizer step on its 2 prompts" in run["log"]


def _check_every_prompt_consumed_once(run: dict[str, Any]) -> Counter[str]:
    lineage = Counter(p for step in run["consumed"] for p in step["prompt_ids"])
    assert lineage and max(lineage.values()) == 1
    summary = run["summary"]
    assert (
        summary["prompts_consumed_unique_total"] == summary["prompts_consumed_total"] == sum(lineage.values())
    )
    return lineage


def test_hybrid_trains_an_iteration_on_every_two_kept_prompts(hybrid: dict[str, Any]) -> None:
    _check_every_step_trains_two_kept_prompts(hybrid)
    metrics = hybrid["metrics"]
    gen = sum(m["dapo/gen_batches"] for m in metrics)
    assert 1 <= gen < ITERS  # one generation batch of 8 feeds several iterations
    assert any(m["dapo/gen_batches"] == 0 for m in metrics)
    assert hybrid["summary"]["prompts_oversampled_total"] <= (gen - 1) * GBS


def test_hybrid_consumes_every_generated_prompt_once(hybrid: dict[str, Any]) -> None:
    lineage = _check_every_prompt_consumed_once(hybrid)
    metrics, summary = hybrid["metrics"], hybrid["summary"]
    gen = sum(m["dapo/gen_batches"] for m in metrics)
    assert sum(lineage.values()) == gen * GBS  # whole generation batches, each prompt once
    # ... every one of them trained, filtered, or surplus (kept but no whole train batch left).
    trained = ITERS * TRAIN
    assert gen * GBS == trained + summary["groups_filtered_total"] + summary["groups_surplus_total"]


def test_async_trains_an_iteration_on_every_two_kept_prompts(asynchronous: dict[str, Any]) -> None:
    _check_every_step_trains_two_kept_prompts(asynchronous)


def test_async_consumes_every_prompt_once(asynchronous: dict[str, Any]) -> None:
    lineage = _check_every_prompt_consumed_once(asynchronous)
    metrics = asynchronous["metrics"]
    filtered = sum(m["dapo/groups_filtered"] for m in metrics)
    # Trained + charged-filtered prompts are what the lineage consumed.
    assert sum(lineage.values()) == ITERS * TRAIN + filtered
    # The base schedule is what the iterations train when nothing is filtered: 5 x 2 prompts.
    assert asynchronous["summary"]["prompts_scheduled"] >= ITERS * TRAIN
