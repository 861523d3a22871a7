"""Start-up: the checkpointer is the plan's (spec, fingerprint, lineage); the rollout starts from a
resumed checkpoint's weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.trainer import checkpointing as ckpt
from mindspeed_rl.trainer import startup

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SCHEDULE = (ScheduledMinibatch(minibatch_id=0, prompt_ids=("a", "b"), batch_group_id=0, predicted_load=0.0,
                               order_index=0),)  # fmt: skip


def _run(tmp_path: Path, resumed: ckpt.ResumePoint | None) -> startup.RunStart:
    plan = build_run_plan(
        load_config_from_files(CONFIGS, "grpo_tiny_asp", ["megatron_training.save_interval=2"])
    )
    return startup.RunStart(
        plan=plan, run_dir=tmp_path, resumed=resumed, placement=None,  # type: ignore[arg-type]
        policy_path="/policy", splits=None,
    )  # fmt: skip


def test_the_checkpointer_follows_the_plan_and_logs_consumed_prompts_into_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, None)
    saver = startup.checkpointer(run, SCHEDULE, extra_files=(tmp_path / "x.json",), hold_iteration=4)
    assert saver.spec == run.plan.checkpoint and saver.fingerprint == ckpt.run_fingerprint(run.plan)
    assert (saver.extra_files, saver.hold_iteration) == ((tmp_path / "x.json",), 4)
    assert saver.lineage.schedule == SCHEDULE and saver.lineage.start_iteration == 0
    saver.lineage.record(0, ("a", "b"))
    assert (tmp_path / ckpt.CONSUMED_LOG).is_file()
    # The held checkpoint is the one after 4 iterations (index 3), no other (save_interval 2).
    holds: list[tuple[int, object]] = []
    monkeypatch.setattr(
        ckpt,
        "write_checkpoint",
        lambda root, state, **kw: holds.append((state.iteration, kw["before_commit"])),
    )
    for index in range(6):
        saver.maybe_save(index, trainer=None)
    assert holds == [(2, None), (4, ckpt.hold_before_commit), (6, None)]
    assert run.rollout_path == "/policy"


def test_a_resumed_run_continues_the_checkpoints_lineage_from_its_weights(tmp_path: Path) -> None:
    point = ckpt.ResumePoint(folder=tmp_path / "iter_0000001", iteration=1, prompts_consumed=("a",),
                             schedule=SCHEDULE)  # fmt: skip
    run = _run(tmp_path, point)
    saver = startup.checkpointer(run, ())
    assert saver.lineage.schedule == SCHEDULE and saver.lineage.start_iteration == 1
    assert run.rollout_path == str(tmp_path / "iter_0000001")
