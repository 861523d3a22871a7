"""The async run's ASP schedule: the demo's exact lengths feed the oracle; the artifact is saved."""

from __future__ import annotations

from pathlib import Path

from mindspeed_rl.trainer import run_schedule
from mindspeed_rl.trainer.async_inputs import run_prompts
from tests.support.plans import prompt_records, small_async_plan

_plan = small_async_plan
_records = prompt_records


def test_true_lengths_only_for_the_demo_task() -> None:
    records = _records(3)
    assert run_schedule.true_lengths(_plan().data, records) == {"p0": 1.0, "p1": 2.0, "p2": 3.0}
    other = _plan("megatron_training.data_path=/data/prompts.jsonl", "warmup_config.enabled=false").data
    assert run_schedule.true_lengths(other, records) is None


def test_schedule_is_built_and_saved(tmp_path: Path) -> None:
    plan = _plan(
        "megatron_training.train_iters=2", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
        "asp_config.sa_iterations=100",
    )  # fmt: skip
    assert plan.asp is not None
    records = run_prompts(plan.data, _records(8))
    minibatches = run_schedule.build_schedule(plan.asp, plan.data, records, tmp_path)
    scheduled = [pid for mb in minibatches for pid in mb.prompt_ids]
    assert sorted(scheduled) == sorted(r.prompt_id for r in records)
    assert (tmp_path / run_schedule.SCHEDULE_FILE).is_file()
