"""A streaming window across a SIGKILL: the checkpoint carries the part of the stream drawn so far,
the resumed run skips it in the source, re-issues what was drawn but not consumed, draws the rest,
and the lineage consumes every prompt of the run exactly once (the real CLI, Ray and HF actors).

Reuses the offline resume test's tiny run (``test_resume_e2e``) with ``asp_config.window=2`` and
online ASP on (so each chunk is also re-planned from the run's lengths), and its deterministic
kill: the checkpoint after iteration 4 is held before its commit, so the run is killed after 3
iterations with the checkpoint after iteration 2 the newest complete one."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import test_resume_e2e as base

from mindspeed_rl.trainer import checkpointing as ckpt
from tests.support.models import PolicyModels

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_windowed_run_killed_then_resumed_draws_the_rest_of_its_stream_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy_models: PolicyModels
) -> None:
    monkeypatch.setattr(base, "TINY", (*base.TINY, "++asp_config.window=2", "++asp_config.online=true"))
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
    drawn = [p for mb in resumed.schedule for p in mb.prompt_ids]
    total = base.TRAIN_ITERS * base.PROMPTS_PER_ITER
    # Only the window was drawn: whole global batches, fewer than the run's, past the consumed ones.
    assert len(drawn) % base.PROMPTS_PER_ITER == 0 and len(resumed.prompts_consumed) < len(drawn) < total
    assert set(resumed.prompts_consumed) <= set(drawn)
    run_dir = base._resume(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_iteration"] == resumed.iteration
    assert summary["prompts_consumed_total"] == summary["prompts_scheduled"] == total
    steps = [json.loads(line) for line in (run_dir / ckpt.CONSUMED_LOG).read_text().splitlines()]
    assert [s["iteration"] for s in steps] == list(range(resumed.iteration, base.TRAIN_ITERS))
    lineage = Counter([*resumed.prompts_consumed, *(p for s in steps for p in s["prompt_ids"])])
    assert len(lineage) == total and max(lineage.values()) == 1
    final = ckpt.load_resume_point(save, base._saved_fingerprint(save))
    assert final.iteration == base.TRAIN_ITERS and Counter(final.prompts_consumed) == lineage
    assert {p for mb in final.schedule for p in mb.prompt_ids} == set(lineage)
