"""Build the run's ASP schedule (the minibatches the Control Unit dispatches) from ``asp_config``.

This is the glue between the run and :mod:`asp_scheduler`: prompt records become
``PromptItem`` s, ``asp_config.predictor_spec()`` picks the predictor
(:func:`asp_scheduler.predictors.predict_lengths`; its module docstring lists what each type
reads), ``asp_config.schedule_params()`` drives ``build_schedule``, and the resulting ``Schedule``
becomes the runtime's ``ScheduledMinibatch`` records (:func:`scheduled_minibatches`).

``predictor.type: none`` is condition C0: consecutive minibatches of ``b`` prompts in dataset
order, no SA. No length information exists, so every predicted length and load is 0.0.
``asp_config.calibrate_loads`` balances batch groups on isotonic-calibrated loads, fitted on the
profiled pairs the predictor did not train on.

Minibatch sizes lie in ``[b, b + kappa]``, except that at most one minibatch is shorter when the
prompt count cannot be split that way (C0: when ``b`` does not divide it). ``schedule_path`` loads
a saved schedule instead, which must list exactly the given prompt ids and match ``b`` and ``k``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asp_scheduler.predictors.base import PredictorQuality, PromptItem
from asp_scheduler.predictors.factory import predict_lengths, shown_ids
from asp_scheduler.schedule import Schedule, build_schedule, fixed_order_schedule
from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.datasets.records import PromptRecord
from mindspeed_rl.runtime.records import ScheduledMinibatch


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSchedule:
    """The saved-able scheduler artifact plus the runtime's view of it (dispatch order)."""

    schedule: Schedule
    minibatches: tuple[ScheduledMinibatch, ...]
    predictor_quality: PredictorQuality | None

    @property
    def num_prompts(self) -> int:
        return sum(m.num_prompts for m in self.minibatches)


def build_run_schedule(
    asp_config: ASPConfig,
    prompt_records: Sequence[PromptRecord],
    *,
    true_lengths: Mapping[str, float] | None = None,
    profiled_pairs: Sequence[tuple[PromptItem, float]] | None = None,
) -> RunSchedule:
    """Schedule every prompt of ``prompt_records`` once; see the module docstring."""
    items = _prompt_items(prompt_records)
    ids = [item.prompt_id for item in items]
    if asp_config.schedule_path:
        schedule = _load_checked(asp_config, ids)
    elif asp_config.predictor.type == "none":
        _check_count(asp_config, len(items))
        if asp_config.calibrate_loads:
            raise ValueError(
                "asp_config.calibrate_loads needs predicted lengths but predictor.type is 'none'; "
                "choose a predictor or set calibrate_loads: false"
            )
        schedule = fixed_order_schedule(
            np.zeros(len(items)), asp_config.b, asp_config.k, item_ids=ids, predictor={"name": "none"}
        )
    else:
        _check_count(asp_config, len(items))
        params = asp_config.schedule_params()
        preds = predict_lengths(
            asp_config.predictor_spec(), items, true_lengths=true_lengths, profiled_pairs=profiled_pairs
        )
        schedule = build_schedule(
            preds.lengths,
            params,
            calibrated_lengths=preds.calibrated_lengths() if params.calibrate_loads else None,
            item_ids=ids,
            predictor=preds.provenance,
            predictor_quality=preds.quality,
        )
    return RunSchedule(
        schedule=schedule,
        minibatches=scheduled_minibatches(schedule),
        predictor_quality=schedule.predictor_quality,
    )


def scheduled_minibatches(schedule: Schedule) -> tuple[ScheduledMinibatch, ...]:
    """The runtime records of ``schedule``, in dispatch order (``order_index`` = position)."""
    if schedule.item_ids is None:
        raise ValueError("the schedule has no prompt ids; build it with item_ids=<prompt ids>")
    item_ids = schedule.item_ids
    loads = schedule.predicted_loads
    return tuple(
        ScheduledMinibatch(
            minibatch_id=position,
            prompt_ids=tuple(item_ids[i] for i in members),
            batch_group_id=int(group),
            predicted_load=float(loads[position]),
            order_index=position,
        )
        for position, (members, group) in enumerate(zip(schedule.minibatches, schedule.batch_group_ids))
    )


def _prompt_items(records: Sequence[PromptRecord]) -> list[PromptItem]:
    if len(records) == 0:
        raise ValueError("no prompts to schedule; load at least asp_config.b prompts first")
    items = [PromptItem(prompt_id=r.prompt_id, text=r.text) for r in records]
    seen: set[str] = set()
    for item in items:
        if item.prompt_id in seen:
            raise ValueError(
                f"prompt id {item.prompt_id!r} occurs twice; every prompt is scheduled once, so ids must "
                "be unique (fix the dataset's id column)"
            )
        seen.add(item.prompt_id)
    return items


def _check_count(cfg: ASPConfig, num_prompts: int) -> None:
    if num_prompts < cfg.b:
        raise ValueError(
            f"only {num_prompts} prompts but asp_config.b={cfg.b} prompts per minibatch; lower asp_config.b "
            "or load more prompts"
        )


def _load_checked(cfg: ASPConfig, ids: Sequence[str]) -> Schedule:
    path = Path(str(cfg.schedule_path))
    if not path.is_file():
        raise ValueError(
            f"asp_config.schedule_path={str(path)!r} does not exist; write it with "
            "`python -m asp_scheduler schedule` or unset schedule_path to build the schedule now"
        )
    schedule = Schedule.load(path)
    if schedule.item_ids is None:
        raise ValueError(f"{path} lists no prompt ids; rebuild it with prompt ids (schedule --prompts ...)")
    listed = [schedule.item_ids[i] for m in schedule.minibatches for i in m]
    wanted = set(ids)
    missing = sorted(wanted - set(listed))
    extra = sorted(set(listed) - wanted)
    if missing or extra or len(listed) != len(ids):
        raise ValueError(
            f"{path} does not cover exactly this run's {len(ids)} prompts (it lists {len(listed)} slots; "
            f"run prompts it lacks: {shown_ids(missing) or 'none'}; prompts not in this run: {shown_ids(extra) or 'none'}); "
            "rebuild the schedule "
            "for this prompt set or unset asp_config.schedule_path"
        )
    if (schedule.params.b, schedule.params.k) != (cfg.b, cfg.k):
        raise ValueError(
            f"{path} was built with b={schedule.params.b}, k={schedule.params.k} but asp_config has "
            f"b={cfg.b}, k={cfg.k}; set them to the schedule's values or rebuild the schedule"
        )
    return schedule
