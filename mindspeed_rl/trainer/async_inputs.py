"""What one async run generates and trains on (``PipelineInputs``), and the test-only knobs a run
may be handed (``RunHooks``).

Which prompts the run schedules: exactly what its ``train_iters`` steps train (``train_iters x
global_batch_size``; with DAPO x ``filter_groups_train_batch_size``, plus the held reserve), drawn with the same
pass/shuffle logic as the hybrid loop (``prompts.global_batches``), so both pipelines see the same
prompts and ``prompts_scheduled == prompts_consumed`` holds by construction. The ASP schedule
reorders them across the whole run; that is the point of it. A prompt drawn again in a later pass
over a small dataset gets an alias id (``<id>@<pass>``), because the runtime tracks prompts by id
and each scheduled prompt must be consumed exactly once.

A trace replay builds its own ``PipelineInputs`` in ``cli/``; fault and crash tests pass
``RunHooks`` built there, so nothing below the trainer reads the environment for test hooks.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mindspeed_rl.datasets.prompt_alias import pass_alias
from mindspeed_rl.models.tokenizer import load_tokenizer
from mindspeed_rl.trainer import oversampling
from mindspeed_rl.trainer.prompts import global_batches, stream_run_prompts, streams_from_files
from mindspeed_rl.trainer.run_schedule import SCHEDULE_FILE, build_schedule
from mindspeed_rl.workers.fault_plan import FaultPlan

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.plan.build import DataSpec
    from mindspeed_rl.runtime.records import ScheduledMinibatch
    from mindspeed_rl.trainer.prompt_window import PromptWindow
    from mindspeed_rl.trainer.startup import RunStart
    from mindspeed_rl.workers.forced_lengths import LengthPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineInputs:
    prompts: tuple[PromptRecord, ...]
    """Every prompt the run schedules, each consumed exactly once."""
    schedule: tuple[ScheduledMinibatch, ...]
    """The minibatches in dispatch order."""
    forced_lengths: Mapping[str, tuple[int, ...]] | LengthPlan | None = None
    """Trace replay: each prompt's per-sample response lengths (EOS ignored); a ``LengthPlan``
    when they depend on the generating weights (a replay under length drift)."""
    predictions: Mapping[str, float] | None = None
    """Trace replay with online ASP: each prompt's offline prediction, the online prior (a run
    of its own reads them from its ``asp_schedule.json``)."""
    simulated_step_seconds: float | None = None
    """Trace replay: the trainer step is a fixed sleep of this many seconds."""
    held_out: tuple[PromptRecord, ...] = ()
    """The split's validation prompts, for periodic evaluation (never trained on)."""
    stream: Iterable[PromptRecord] | None = None
    """``asp_config.window``: every prompt of the run in draw order, read only as the window
    needs (``trainer/prompt_window.py``); ``prompts`` and ``schedule`` are then built from it."""
    window: PromptWindow | None = None
    """Set by ``run_inputs`` for a streaming run: the rest of ``stream``; ``prompts`` and
    ``schedule`` then hold the first window (a resumed run: the checkpoint's remaining schedule)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunHooks:
    """Test-only knobs (``cli/fault_hooks.py``, ``cli/checkpoint_hooks.py``); production passes none."""

    faults: FaultPlan = field(default_factory=FaultPlan)
    """Fault tests: which processes exit, and when."""
    checkpoint_hold_iteration: int | None = None
    """Crash tests: the checkpoint after this many iterations stops before its commit until killed."""


def run_prompts(data: DataSpec, records: Sequence[PromptRecord]) -> list[PromptRecord]:
    """The run's prompts in hybrid's draw order, repeated draws renamed ``<id>@<pass>``."""
    by_id = {r.prompt_id: r for r in records}
    seen: Counter[str] = Counter()
    chosen: list[PromptRecord] = []
    for batch in global_batches(data, [r.prompt_id for r in records]):
        for pid in batch:
            alias = pass_alias(pid, seen[pid])
            seen[pid] += 1
            chosen.append(dataclasses.replace(by_id[pid], prompt_id=alias))
    return chosen


def run_inputs(run: RunStart, given: PipelineInputs | None) -> PipelineInputs:
    """``given`` (a trace replay's) or the run's own: its split's prompts in hybrid's draw order
    with their ASP schedule (saved into the run dir). A resumed run keeps the checkpoint's
    schedule minus its consumed prompts, never a rebuilt one: a rebuild would reorder prompts
    across the consumed/unconsumed line if anything in the predictor changed."""
    if given is None:
        given = _from_split(run, build=run.resumed is None)
    if given.stream is not None:
        return _windowed(run, given, given.stream)
    if run.resumed is None:
        return given
    known = {r.prompt_id for r in given.prompts}
    missing = [p for mb in run.resumed.schedule for p in mb.prompt_ids if p not in known]
    if missing:
        raise ValueError(
            f"{len(missing)} prompts of checkpoint {run.resumed.folder}'s schedule (e.g. {missing[:3]}) are "
            "not in this run's data; resume with the same megatron_training.data_path contents"
        )
    saved = run.resumed.folder / SCHEDULE_FILE
    if saved.is_file():  # the run dir carries its schedule artifact, as a fresh run's does
        shutil.copy2(saved, run.run_dir / SCHEDULE_FILE)
    return dataclasses.replace(given, schedule=run.resumed.remaining_schedule)


def _from_split(run: RunStart, *, build: bool) -> PipelineInputs:
    """The split's training prompts as the run draws them; their ASP schedule when ``build``."""
    if run.splits is None:
        raise ValueError("the run was started without loading its prompts; pass its PipelineInputs")
    data, sampling = run.plan.data, run.plan.dynamic_sampling
    window = None if run.plan.asp is None else run.plan.asp.window
    if streams_from_files(data, window):  # read and tokenized only as the window draws
        held_out = frozenset(r.prompt_id for r in run.splits.valid)
        stream = stream_run_prompts(data, load_tokenizer(run.policy_path), held_out=held_out)
        return PipelineInputs(prompts=(), schedule=(), held_out=run.splits.valid, stream=stream)
    records = tuple(run_prompts(oversampling.drawn_data(data, sampling), run.splits.train))
    if window is not None:
        # A shuffle or a held-out part needs the split whole; the schedule still streams.
        return PipelineInputs(prompts=(), schedule=(), held_out=run.splits.valid, stream=records)
    # Dynamic sampling draws further: the base is what a run without it trains on, the rest is
    # the held over-sampling reserve (trainer/oversampling.py).
    num_base = data.train_iters * data.num_prompts_per_step
    schedule: tuple[ScheduledMinibatch, ...] = ()
    if build:
        if run.plan.asp is None:
            raise ValueError(f"pipeline: {run.plan.pipeline} has no ASP schedule; use pipeline: async")
        schedule = build_schedule(run.plan.asp, data, records[:num_base], run.run_dir)
        schedule += oversampling.reserve_schedule(run.plan.asp, data, records[num_base:], after=schedule)
    return PipelineInputs(prompts=records, schedule=schedule, held_out=run.splits.valid)


def _windowed(run: RunStart, given: PipelineInputs, stream: Iterable[PromptRecord]) -> PipelineInputs:
    """A streaming run's first window (fresh) or its checkpoint's remaining schedule (resumed, the
    source moved past what the lineage drew); the actors' and trainer's tables hold only these."""
    from mindspeed_rl.trainer.prompt_window import skip_drawn

    if run.resumed is None:
        window = _window(run, stream, drawn_batches=0, stream=stream)
        first = window.top_up(0)
        assert first is not None, "an empty window draws its first chunk"
        return dataclasses.replace(given, prompts=first.records, schedule=first.minibatches, window=window)
    per_batch = run.plan.data.num_prompts_per_global_batch
    drawn = [p for mb in run.resumed.schedule for p in mb.prompt_ids]
    if len(drawn) % per_batch:
        raise ValueError(
            f"checkpoint {run.resumed.folder} scheduled {len(drawn)} prompts, not whole global batches of "
            f"{per_batch}: it was not written by a streaming run with this global_batch_size"
        )
    records, rest = skip_drawn(stream, drawn)
    window = _window(run, rest, drawn_batches=len(drawn) // per_batch, stream=stream)
    window.continue_after(run.resumed.schedule)
    remaining = run.resumed.remaining_schedule
    kept = tuple(records[p] for mb in remaining for p in mb.prompt_ids)
    return dataclasses.replace(given, prompts=kept, schedule=remaining, window=window)


def _window(
    run: RunStart, source: Iterable[PromptRecord], *, drawn_batches: int, stream: Iterable[PromptRecord]
) -> PromptWindow:
    from mindspeed_rl.trainer.prompt_window import PromptWindow
    from mindspeed_rl.trainer.run_schedule import chunk_scheduler

    asp, data = run.plan.asp, run.plan.data
    if asp is None or asp.window is None:
        raise ValueError("a prompt stream needs asp_config.window (and rl_config.pipeline: async)")
    known = stream if isinstance(stream, Sequence) else None  # the split: known up front
    return PromptWindow(
        source,
        window=asp.window,
        prompts_per_batch=data.num_prompts_per_global_batch,
        total_batches=data.generation_batches,
        schedule_chunk=chunk_scheduler(asp, data, known),
        drawn_batches=drawn_batches,
    )
