"""The pure parts of checkpoint/resume: schedule filtering, atomic writes and newest-complete
discovery, the run fingerprint, the lineage's summary counts."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.trainer import checkpointing as ckpt

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _mb(i: int, ids: str, group: int) -> ScheduledMinibatch:
    return ScheduledMinibatch(
        minibatch_id=i,
        prompt_ids=tuple(ids),
        batch_group_id=group,
        predicted_load=10.0 * len(ids),
        order_index=i,
    )


SCHEDULE = (_mb(0, "ab", 0), _mb(1, "cde", 0), _mb(2, "fg", 1), _mb(3, "h", 1))


def test_remaining_schedule_shrinks_partly_consumed_minibatches_and_keeps_order() -> None:
    left = ckpt.remaining_schedule(SCHEDULE, ["a", "b", "d", "h"])
    assert [(mb.minibatch_id, mb.prompt_ids, mb.batch_group_id) for mb in left] == [
        (1, ("c", "e"), 0),
        (2, ("f", "g"), 1),
    ]
    assert left[0].predicted_load == pytest.approx(20.0) and left[0].order_index == 1
    assert ckpt.remaining_schedule(SCHEDULE, []) == SCHEDULE
    with pytest.raises(ValueError, match="not in the checkpoint's schedule"):
        ckpt.remaining_schedule(SCHEDULE, ["zz"])


def test_schedule_json_round_trip() -> None:
    assert ckpt.schedule_from_json(json.loads(json.dumps(ckpt.schedule_to_json(SCHEDULE)))) == SCHEDULE


def _state(iteration: int, consumed: str) -> ckpt.PipelineState:
    return ckpt.PipelineState(
        iteration=iteration,
        prompts_consumed=tuple(consumed),
        snapshot_version=iteration,
        resumed_from_iteration=None,
    )


def _trainer_files(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"weights")


def test_write_is_atomic_and_the_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    fp = {"seed": 1}
    first = ckpt.write_checkpoint(
        tmp_path, _state(2, "ab"), schedule=SCHEDULE, fingerprint=fp, write_trainer_state=_trainer_files
    )
    assert first == tmp_path / "iter_0000002" and (first / ckpt.MANIFEST).is_file()
    assert (tmp_path / ckpt.LATEST).read_text().strip() == "2"

    # A write killed before its commit leaves only a hidden partial folder behind.
    def crash(_: Path) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ckpt.write_checkpoint(
            tmp_path, _state(4, "abcd"), schedule=SCHEDULE, fingerprint=fp,
            write_trainer_state=_trainer_files, before_commit=crash,
        )  # fmt: skip
    assert (tmp_path / ".iter_0000004.partial").is_dir() and not (tmp_path / "iter_0000004").exists()
    assert ckpt.find_latest(tmp_path) == first
    # A folder renamed into place without a manifest (hand-copied, damaged) is not complete either.
    (tmp_path / "iter_0000009").mkdir()
    point = ckpt.load_resume_point(tmp_path, fp)
    assert (point.folder, point.iteration, point.prompts_consumed) == (first, 2, ("a", "b"))
    assert point.schedule == SCHEDULE
    assert [mb.prompt_ids for mb in point.remaining_schedule] == [("c", "d", "e"), ("f", "g"), ("h",)]

    # The rerun writes iteration 4 again: the stale partial folder is replaced, not read.
    again = ckpt.write_checkpoint(
        tmp_path, _state(4, "abcd"), schedule=SCHEDULE, fingerprint=fp, write_trainer_state=_trainer_files
    )
    assert ckpt.find_latest(tmp_path) == again and not (tmp_path / ".iter_0000004.partial").exists()
    assert ckpt.find_latest(again) == again  # load may name one checkpoint folder directly


def test_a_held_write_stops_with_every_file_written_and_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash tests' kill point: ``hold_before_commit`` marks the partial folder once its files
    are written and waits; no manifest, no rename, until released (here) or killed (in a run)."""
    release = threading.Event()
    monkeypatch.setattr(ckpt, "_HOLD_RELEASE", release)
    done: list[Path] = []
    write = threading.Thread(
        target=lambda: done.append(
            ckpt.write_checkpoint(
                tmp_path,
                _state(2, "ab"),
                schedule=SCHEDULE,
                fingerprint={"seed": 1},
                write_trainer_state=_trainer_files,
                before_commit=ckpt.hold_before_commit,
            )  # fmt: skip
        ),
        daemon=True,
    )
    write.start()
    partial = tmp_path / ".iter_0000002.partial"
    while not (partial / ckpt.HOLD_MARKER).is_file():
        assert write.is_alive(), "the write ended without holding"
        time.sleep(0.01)
    assert {ckpt.PIPELINE_STATE, ckpt.SCHEDULE} <= {p.name for p in partial.iterdir()}
    assert not (partial / ckpt.MANIFEST).exists() and ckpt.find_latest(tmp_path) is None
    assert not done
    release.set()
    write.join()
    assert done == [tmp_path / "iter_0000002"] and ckpt.find_latest(tmp_path) == done[0]


def test_no_complete_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / ".iter_0000002.partial").mkdir()
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        ckpt.load_resume_point(tmp_path, {})


def test_the_fingerprint_keeps_the_keys_and_values_checkpoints_were_written_with() -> None:
    # Saved manifests hold exactly this dict; any change here makes every old checkpoint foreign.
    plan = build_run_plan(
        load_config_from_files(
            CONFIGS,
            "grpo_tiny_asp",
            # pinned here, so tuning the demo's data does not change what the test pins
            [
                "megatron_training.no_shuffle=true",
                "megatron_training.split='100,0,0'",
                "megatron_training.data_path=builtin:demo",
                "megatron_training.train_iters=30",
                "megatron_training.eval_interval=null",
            ],
        )  # fmt: skip
    )
    assert ckpt.run_fingerprint(plan) == {
        "pipeline": "async", "data_path": "builtin:demo", "valid_data_path": None, "split": "100,0,0",
        "no_shuffle": True, "seed": 1, "global_batch_size": 32, "mini_batch_size": 32, "epochs": 1,
        "n_samples_per_prompt": 8, "train_iters": 30,
    }  # fmt: skip
    assert list(ckpt.run_fingerprint(plan))[:3] == ["pipeline", "data_path", "valid_data_path"]


def test_a_checkpoint_of_another_run_setup_is_refused_naming_what_differs(tmp_path: Path) -> None:
    base = load_config_from_files(CONFIGS, "grpo_tiny_asp")
    fp = ckpt.run_fingerprint(build_run_plan(base))
    ckpt.write_checkpoint(
        tmp_path, _state(2, "ab"), schedule=SCHEDULE, fingerprint=fp, write_trainer_state=_trainer_files
    )
    other = load_config_from_files(
        CONFIGS,
        "grpo_tiny_asp",
        ["megatron_training.global_batch_size=64", "rl_config.n_samples_per_prompt=4"],
    )
    with pytest.raises(ValueError) as err:
        ckpt.load_resume_point(tmp_path, ckpt.run_fingerprint(build_run_plan(other)))
    message = str(err.value)
    assert "global_batch_size: checkpoint 32, this run 64" in message
    assert "n_samples_per_prompt: checkpoint 8, this run 4" in message
    assert "seed" not in message and "finetune: true" in message
    assert ckpt.load_resume_point(tmp_path, fp).iteration == 2


def test_load_without_finetune_is_a_resume_in_the_plan(tmp_path: Path) -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_asp", [f"++actor_config.load={tmp_path}", "++actor_config.no_load_rng=true"]
    )
    plan = build_run_plan(config)
    spec = plan.checkpoint
    assert spec.resume_dir == str(tmp_path) and spec.load_optim and not spec.load_rng
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        ckpt.resume_point(plan)
    finetune = load_config_from_files(
        CONFIGS, "grpo_tiny_asp", [f"++actor_config.load={tmp_path}", "++actor_config.finetune=true"]
    )
    assert ckpt.resume_point(build_run_plan(finetune)) is None


def test_lineage_carries_consumed_prompts_across_runs(tmp_path: Path) -> None:
    fresh = ckpt.Lineage(SCHEDULE, None, tmp_path / ckpt.CONSUMED_LOG)
    fresh.record(0, "ab")
    fresh.record(1, "cd")
    logged = [json.loads(line) for line in (tmp_path / ckpt.CONSUMED_LOG).read_text().splitlines()]
    assert logged == [{"iteration": 0, "prompt_ids": ["a", "b"]}, {"iteration": 1, "prompt_ids": ["c", "d"]}]
    assert fresh.start_iteration == 0 and fresh.state(2).prompts_consumed == tuple("abcd")
    point = ckpt.ResumePoint(folder=tmp_path, iteration=2, prompts_consumed=tuple("abcd"), schedule=SCHEDULE)
    resumed = ckpt.Lineage(point.remaining_schedule, point)
    assert resumed.schedule == SCHEDULE  # the original schedule is what the next checkpoint carries
    resumed.record(2, "efgh")
    assert resumed.state(4).resumed_from_iteration == 2
    (tmp_path / "summary.json").write_text(json.dumps({"prompts_scheduled": 4, "prompts_consumed": 4}))
    ckpt.add_lineage_summary(tmp_path, resumed)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["prompts_consumed_total"] == summary["prompts_scheduled"] == 8
    assert summary["prompts_scheduled_this_run"] == summary["prompts_consumed"] == 4
    assert summary["resumed_from_iteration"] == 2 and summary["prompts_consumed_unique_total"] == 8
