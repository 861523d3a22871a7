"""Online ASP across a SIGKILL: the checkpoint carries the re-planned schedule and the resumed run
continues it, consuming every prompt of the lineage exactly once (the real CLI, Ray and HF actors).

Reuses the offline resume test's tiny run (``test_resume_e2e``) with ``asp_config.online`` on, and
its deterministic kill: the checkpoint after iteration 4 is held before its commit, so the run is
killed after 3 iterations with the checkpoint after iteration 2 the newest complete one."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import test_resume_e2e as base

from mindspeed_rl.trainer import checkpointing as ckpt
from tests.support.models import PolicyModels

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_online_asp_sigkill_then_resume_continues_the_replanned_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy_models: PolicyModels
) -> None:
    monkeypatch.setattr(base, "TINY", (*base.TINY, "++asp_config.online=true"))
    policy_models.provide(tmp_path / "model", "grpo_tiny_asp", base.TINY)
    save = tmp_path / "save"
    ray_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    base._run_then_kill(
        tmp_path,
        lambda run_dir, _: ckpt.find_latest(save) is not None and base._iterations_done(run_dir) >= 3,
        ray_dir,
        **base.HOLD,
    )
    resumed = ckpt.load_resume_point(save, base._saved_fingerprint(save))
    assert resumed.iteration == 2
    # Re-planned minibatches are numbered after the original schedule's 12 (24 prompts / b=2).
    assert max(mb.minibatch_id for mb in resumed.schedule) >= 12
    run_dir = base._resume(tmp_path)
    base._check_lineage(run_dir, resumed, save)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["starvation"]["num_prompts"] == summary["prompts_consumed"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("asp/prior_pairs" in m for m in metrics)
