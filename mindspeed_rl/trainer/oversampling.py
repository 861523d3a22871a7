"""DAPO's over-sampling reserve for the async pipeline: the prompts dynamic sampling may need
beyond the run's ``train_iters x global_batch_size``, drawn from the same stream and ASP-scheduled
like the rest, but held by the Control Unit until filtering makes them necessary.

The run draws its prompts exactly as without DAPO (same passes, same shuffle, same aliases), only
further: the first ``train_iters x filter_groups_train_batch_size`` prompts are the base schedule
(what the steps train when nothing is filtered; with the train batch equal to global_batch_size,
byte-identical to a run without dynamic sampling), the rest of ``R`` times the base's generation
batches the reserve, with
``R = filter_groups_max_batches`` (each trainer step may use at most that many generation batches,
so the run can never need more) or ``UNLIMITED_RESERVE_FACTOR`` when it is -1. The reserve is
scheduled by the same ASP builder into its own balanced batch groups, numbered after the base, and
marked ``reserve``; the Control Unit releases it one batch group at a time
(``runtime.group_filter``). A checkpoint carries base and reserve, so a resumed run holds and
releases the same prompts and consumes each once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import ASPConfig
    from mindspeed_rl.contracts import DynamicSampling
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.plan.build import DataSpec
    from mindspeed_rl.runtime.group_filter import GroupFilter
    from mindspeed_rl.runtime.records import ScheduledMinibatch

UNLIMITED_RESERVE_FACTOR = 8
"""With ``filter_groups_max_batches: -1``: the run may generate up to 8x its base prompts; a run
that filters more than 7 of every 8 groups stops naming the key instead of drawing without end
(the reserve is prompt records and schedule entries only: 8x costs kilobytes per prompt)."""


def reserve_factor(sampling: DynamicSampling) -> int:
    return UNLIMITED_RESERVE_FACTOR if sampling.max_batches is None else sampling.max_batches


def drawn_data(data: DataSpec, sampling: DynamicSampling | None) -> DataSpec:
    """The data spec whose draw covers base + reserve (``data`` itself without dynamic sampling)."""
    if sampling is None:
        return data
    factor = reserve_factor(sampling)
    # train_iters only sizes the draw here (DataSpec.generation_batches), never a loop.
    return dataclasses.replace(data, train_iters=data.train_iters * factor)


def group_filter(sampling: DynamicSampling) -> GroupFilter:
    from mindspeed_rl.runtime.group_filter import GroupFilter

    return GroupFilter(
        generation_batch_prompts=sampling.generation_batch_prompts,
        max_prompts_per_step=sampling.max_prompts_per_step(),
    )


def reserve_schedule(
    asp: ASPConfig,
    data: DataSpec,
    records: Sequence[PromptRecord],
    after: Sequence[ScheduledMinibatch],
) -> tuple[ScheduledMinibatch, ...]:
    """``records`` ASP-scheduled, numbered after ``after`` (ids, groups, positions), held."""
    from mindspeed_rl.datasets.asp_schedule import build_run_schedule
    from mindspeed_rl.trainer.run_schedule import true_lengths

    if not records:
        return ()
    lengths = (
        true_lengths(data, records)
        if asp.predictor.type == "oracle_noisy" and not asp.predictor.path
        else None
    )
    built = build_run_schedule(dataclasses.replace(asp, schedule_path=None), records, true_lengths=lengths)
    next_id = 1 + max((mb.minibatch_id for mb in after), default=-1)
    next_group = 1 + max((mb.batch_group_id for mb in after), default=-1)
    next_order = 1 + max((mb.order_index for mb in after), default=-1)
    return tuple(
        dataclasses.replace(
            mb,
            minibatch_id=next_id + mb.minibatch_id,
            batch_group_id=next_group + mb.batch_group_id,
            order_index=next_order + mb.order_index,
            reserve=True,
        )
        for mb in built.minibatches
    )
