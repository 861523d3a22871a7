"""Which prompts an async run schedules: hybrid's draws, repeats aliased; a resume keeps its schedule."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.datasets.split import PromptSplits
from mindspeed_rl.plan.build import RunPlan
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.trainer import async_inputs
from mindspeed_rl.trainer.checkpointing import ResumePoint
from mindspeed_rl.trainer.prompts import global_batches
from mindspeed_rl.trainer.run_schedule import SCHEDULE_FILE
from mindspeed_rl.trainer.startup import RunStart
from tests.support.plans import prompt_records, small_async_plan

_plan = small_async_plan
_records = prompt_records


def _run(
    plan: RunPlan, run_dir: Path, records: list[PromptRecord], resumed: ResumePoint | None = None
) -> RunStart:
    splits = PromptSplits(train=tuple(records), valid=(), test=())
    return RunStart(
        plan=plan, run_dir=run_dir, resumed=resumed, placement=None,  # type: ignore[arg-type]
        policy_path="/m", splits=splits,
    )  # fmt: skip


def test_run_prompts_follow_hybrid_draws_and_alias_repeats() -> None:
    data = _plan("megatron_training.train_iters=5").data
    records = _records(6)
    chosen = async_inputs.run_prompts(data, records)
    hybrid = [pid for batch in global_batches(data, [r.prompt_id for r in records]) for pid in batch]
    assert len(chosen) == 5 * 4 == len(hybrid)
    assert [r.prompt_id.split("@")[0] for r in chosen] == hybrid  # same draws, same order
    assert len({r.prompt_id for r in chosen}) == len(chosen)  # aliases make every slot unique
    assert Counter(r.prompt_id for r in chosen if "@" in r.prompt_id)  # 20 slots over 6 prompts repeat
    by_id = {r.prompt_id: r for r in records}
    assert all(r.token_ids == by_id[r.prompt_id.split("@")[0]].token_ids for r in chosen)


def test_a_fresh_run_schedules_its_draws_and_saves_the_schedule(tmp_path: Path) -> None:
    plan = _plan("megatron_training.train_iters=2", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
                 "asp_config.sa_iterations=100")  # fmt: skip
    built = async_inputs.run_inputs(_run(plan, tmp_path, _records(8)), None)
    assert sorted(p for mb in built.schedule for p in mb.prompt_ids) == sorted(
        r.prompt_id for r in built.prompts
    )
    assert len(built.prompts) == 2 * 4 and (tmp_path / SCHEDULE_FILE).is_file()


def test_a_resumed_run_keeps_the_checkpoints_schedule_minus_what_it_consumed(tmp_path: Path) -> None:
    plan = _plan("megatron_training.train_iters=2")
    records = _records(8)
    drawn = [r.prompt_id for r in async_inputs.run_prompts(plan.data, records)]
    schedule = tuple(
        ScheduledMinibatch(minibatch_id=i, prompt_ids=tuple(drawn[2 * i : 2 * i + 2]), batch_group_id=i,
                           predicted_load=1.0, order_index=i)
        for i in range(4)
    )  # fmt: skip
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    (folder / SCHEDULE_FILE).write_text("{}")
    point = ResumePoint(folder=folder, iteration=1, prompts_consumed=drawn[:4], schedule=schedule)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    built = async_inputs.run_inputs(_run(plan, run_dir, records, point), None)
    assert built.schedule == schedule[2:] and (run_dir / SCHEDULE_FILE).read_text() == "{}"
    foreign = ResumePoint(folder=folder, iteration=1, prompts_consumed=(), schedule=(schedule[0], _mb("zz")))
    with pytest.raises(ValueError, match="not in this run's data"):
        async_inputs.run_inputs(_run(plan, run_dir, records, foreign), None)


def _mb(pid: str) -> ScheduledMinibatch:
    return ScheduledMinibatch(
        minibatch_id=9, prompt_ids=(pid,), batch_group_id=9, predicted_load=0.0, order_index=9
    )


def test_given_inputs_replace_the_split(tmp_path: Path) -> None:
    given = async_inputs.PipelineInputs(prompts=tuple(_records(2)), schedule=(_mb("p0"),))
    run = _run(_plan(), tmp_path, [])
    assert async_inputs.run_inputs(run, given) is given


def test_a_window_of_one_batch_schedules_with_the_oracle_calibrated_once(tmp_path: Path) -> None:
    """The noisy oracle cannot hit its tau on a chunk of 4 prompts; the window calibrates its noise
    once over the split and every chunk schedules (the tiny CLI run with window=2 died here)."""
    plan = _plan("megatron_training.train_iters=6", "++asp_config.window=1", "asp_config.b=2",
                 "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=100")  # fmt: skip
    assert (
        plan.asp is not None and plan.asp.predictor.type == "oracle_noisy" and plan.asp.predictor.calibrate_nu
    )
    built = async_inputs.run_inputs(_run(plan, tmp_path, _records(24)), None)
    assert built.window is not None
    drawn = [p for mb in built.schedule for p in mb.prompt_ids]
    for step in range(6):
        if (chunk := built.window.top_up(step)) is not None:
            assert sorted(p for mb in chunk.minibatches for p in mb.prompt_ids) == sorted(
                r.prompt_id for r in chunk.records
            )
            drawn += [p for mb in chunk.minibatches for p in mb.prompt_ids]
    assert sorted(drawn) == sorted(f"p{i}" for i in range(24)) and built.window.closed


def test_a_lazy_stream_too_short_to_calibrate_the_oracle_names_the_fix(tmp_path: Path) -> None:
    plan = _plan("megatron_training.train_iters=6", "++asp_config.window=1", "asp_config.b=2",
                 "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=100")  # fmt: skip
    given = async_inputs.PipelineInputs(prompts=(), schedule=(), stream=iter(_records(24)))
    with pytest.raises(ValueError, match="calibrate_nu=false"):
        async_inputs.run_inputs(_run(plan, tmp_path, []), given)
