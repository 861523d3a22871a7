"""Lossless checkpoint and resume, in upstream's keys (``save_interval``, ``save``, ``load``, ``no_*``).

::

    <save>/
      iter_0000004/                  one complete checkpoint, renamed into place whole
        config.json, *.safetensors,  the trainer's HF folder (save_hf): loadable as a model
        tokenizer files ...
        trainer_state.pt             optimizer, step counts, KL coefficient, RNG (models/training/trainer_state.py)
        mcore_dist/                  the megatron engine only: megatron's distributed checkpoint of
                                     weights + optimizer (models/training/megatron/checkpoint.py)
        pipeline_state.json          iteration, prompts consumed over the whole lineage, snapshot version
        schedule.json                the lineage's schedule: minibatches of prompt ids in dispatch order
        asp_schedule.json            the ASP artifact with its predictor's provenance (async; copied)
        checkpoint.json              manifest with the run fingerprint: written LAST, so present = complete
      .iter_0000006.partial/         a write in progress, or one a crash interrupted: never read
      latest_checkpointed_iteration.txt   Megatron's tracker name; informational, updated after the rename

Resume (``load`` without ``finetune``) takes the newest folder with a manifest, so a crash at any
point of a write leaves the previous checkpoint in charge. The resumed run trains iterations
``N .. train_iters-1`` on the ORIGINAL schedule minus the prompts consumed so far: whatever was in
flight or queued when the run died is simply scheduled again, nothing is consumed twice. Both
pipelines consume whole prompts per step, so "consumed" is exact at every step boundary.

The trainer side is two calls every engine implements: ``save_state(dir, optimizer=, rng=)`` and
``load_state(dir, optimizer=, rng=)`` (``models/training/base.py``); a sharded engine's ranks all
write into the same folder. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime.records import ScheduledMinibatch

if TYPE_CHECKING:
    from mindspeed_rl.plan.build import CheckpointSpec, RunPlan

logger = logging.getLogger(__name__)
MANIFEST = "checkpoint.json"
PIPELINE_STATE = "pipeline_state.json"
CONSUMED_LOG = "prompts_consumed.jsonl"
"""In the run dir: the prompt ids of every step this run trained, one JSON line per step."""
SCHEDULE = "schedule.json"
LATEST = "latest_checkpointed_iteration.txt"
FORMAT = 1
_FOLDER = re.compile(r"^iter_(\d{7})$")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineState:
    """Where the lineage stands after ``iteration`` trained iterations."""

    iteration: int
    prompts_consumed: tuple[str, ...]
    """Every prompt trained on so far, over all runs of the lineage, in consumption order."""
    snapshot_version: int
    """Policy version of the saved weights, in lineage terms (= iteration)."""
    resumed_from_iteration: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumePoint:
    """A complete checkpoint, read back for a resumed run."""

    folder: Path
    iteration: int
    prompts_consumed: tuple[str, ...]
    schedule: tuple[ScheduledMinibatch, ...]
    """The lineage's original schedule (not rebuilt, not yet filtered)."""

    @property
    def remaining_schedule(self) -> tuple[ScheduledMinibatch, ...]:
        return remaining_schedule(self.schedule, self.prompts_consumed)


# ---- the run setup a checkpoint belongs to ---------------------------------------------------------
def run_fingerprint(plan: RunPlan) -> dict[str, Any]:
    """What must match for a checkpoint's consumed list and schedule to mean the same prompts.
    Keyed by the upstream config keys, so a refusal names what to change."""
    data, engine = plan.data, plan.trainer.engine
    return {
        "pipeline": plan.pipeline,
        "data_path": data.data_path,
        "valid_data_path": data.valid_data_path,
        "split": data.split,
        "no_shuffle": not data.shuffle,
        "seed": data.seed,
        "global_batch_size": data.num_prompts_per_global_batch,
        "mini_batch_size": engine.mini_batch_size,
        "epochs": engine.epochs,
        "n_samples_per_prompt": plan.trainer.n_samples_per_prompt,
        "train_iters": data.train_iters,
        # Only where it differs, so checkpoints written before the key existed still match.
        **(
            {"filter_groups_train_batch_size": data.num_prompts_per_step}
            if data.num_prompts_per_step != data.num_prompts_per_global_batch
            else {}
        ),
    }


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any], folder: Path) -> None:
    differing = [k for k in sorted({*saved, *current}) if saved.get(k) != current.get(k)]
    if differing:
        details = "; ".join(
            f"{k}: checkpoint {saved.get(k)!r}, this run {current.get(k)!r}" for k in differing
        )
        raise ValueError(
            f"checkpoint {folder} belongs to a different run setup ({details}); resume with the "
            "checkpoint's settings, or start a new run from its weights with actor_config.finetune: true"
        )


# ---- the schedule ------------------------------------------------------------------------------------
def remaining_schedule(
    schedule: Sequence[ScheduledMinibatch], consumed: Iterable[str]
) -> tuple[ScheduledMinibatch, ...]:
    """``schedule`` without the consumed prompts: partly consumed minibatches shrink, emptied ones
    go, the rest keep their ids, batch groups and dispatch positions (so group order holds)."""
    done = set(consumed)
    unknown = done - {p for mb in schedule for p in mb.prompt_ids}
    if unknown:
        raise ValueError(
            f"{len(unknown)} consumed prompts (e.g. {sorted(unknown)[:3]}) are not in the checkpoint's "
            "schedule; the checkpoint is damaged: resume from an earlier iter_* folder"
        )
    out = []
    for mb in schedule:
        kept = tuple(p for p in mb.prompt_ids if p not in done)
        if kept:
            # Per-prompt predictions are not kept in the record; scale the load by the share left.
            load = mb.predicted_load * len(kept) / len(mb.prompt_ids)
            out.append(dataclasses.replace(mb, prompt_ids=kept, predicted_load=load))
    return tuple(out)


def schedule_to_json(schedule: Sequence[ScheduledMinibatch]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(mb) for mb in schedule]


def schedule_from_json(rows: Sequence[Mapping[str, Any]]) -> tuple[ScheduledMinibatch, ...]:
    return tuple(
        ScheduledMinibatch(
            minibatch_id=int(r["minibatch_id"]),
            prompt_ids=tuple(r["prompt_ids"]),
            batch_group_id=int(r["batch_group_id"]),
            predicted_load=float(r["predicted_load"]),
            order_index=int(r["order_index"]),
            reserve=bool(r.get("reserve", False)),
        )
        for r in rows
    )


def batches_as_schedule(batches: Sequence[Sequence[str]]) -> tuple[ScheduledMinibatch, ...]:
    """The hybrid loop's global batches as a schedule (one minibatch per iteration, as it generates)."""
    return tuple(
        ScheduledMinibatch(
            minibatch_id=i, prompt_ids=tuple(b), batch_group_id=i, predicted_load=0.0, order_index=i
        )
        for i, b in enumerate(batches)
    )


# ---- writing -----------------------------------------------------------------------------------------
def write_checkpoint(
    root: Path,
    state: PipelineState,
    *,
    schedule: Sequence[ScheduledMinibatch],
    fingerprint: Mapping[str, Any],
    write_trainer_state: Callable[[Path], None],
    extra_files: Sequence[Path] = (),
    before_commit: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``<root>/iter_<N>/`` atomically: everything into a hidden partial folder, fsync, the
    manifest last, rename, then the ``latest`` pointer. ``before_commit`` (crash tests) runs after
    the files are written and before the manifest."""
    final = root / f"iter_{state.iteration:07d}"
    partial = root / f".iter_{state.iteration:07d}.partial"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)  # left by a write a crash interrupted
    partial.mkdir()
    write_trainer_state(partial)
    _write_json(partial / PIPELINE_STATE, dataclasses.asdict(state))
    _write_json(partial / SCHEDULE, schedule_to_json(schedule))
    for extra in extra_files:
        if extra.is_file():
            shutil.copy2(extra, partial / extra.name)
    _fsync_files(partial)  # the trainer's HF save does not fsync
    if before_commit is not None:
        before_commit(partial)
    manifest = {
        "format": FORMAT,
        "iteration": state.iteration,
        "fingerprint": dict(fingerprint),
        "files": sorted(p.name for p in partial.iterdir()),
        "written_at": time.time(),
    }
    _write_json(partial / MANIFEST, manifest)
    _fsync_dir(partial)
    if final.exists():  # the same iteration written again (a lineage restarted further back)
        stale = root / f".iter_{state.iteration:07d}.stale"
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)
        shutil.rmtree(stale)
    partial.rename(final)
    _fsync_dir(root)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(f"{state.iteration}\n", encoding="utf-8")
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)
    return final


def _write_json(path: Path, payload: Any) -> None:
    with path.open("w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- reading -----------------------------------------------------------------------------------------
def find_latest(root: Path) -> Path | None:
    """The complete checkpoint with the highest iteration in ``root`` (or ``root`` itself when it
    is one); partial folders, and folders whose manifest is missing or unreadable, are skipped."""
    if _manifest(root) is not None:
        return root
    found = [
        (int(m.group(1)), d)
        for d in (root.iterdir() if root.is_dir() else ())
        if (m := _FOLDER.match(d.name)) and d.is_dir() and _manifest(d) is not None
    ]
    return max(found)[1] if found else None


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        manifest: dict[str, Any] = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("format") == FORMAT else None


def load_resume_point(root: Path, fingerprint: Mapping[str, Any]) -> ResumePoint:
    """The newest complete checkpoint under ``root``, checked against this run's ``fingerprint``."""
    folder = find_latest(root)
    if folder is None:
        raise ValueError(
            f"actor_config.load={root} holds no complete checkpoint (no iter_*/{MANIFEST}); point it at "
            "a folder written with save_interval + actor_config.save, or set finetune: true to start "
            "from an HF folder's weights"
        )
    manifest = _manifest(folder)
    assert manifest is not None
    check_fingerprint(manifest["fingerprint"], fingerprint, folder)
    state = json.loads((folder / PIPELINE_STATE).read_text(encoding="utf-8"))
    schedule = schedule_from_json(json.loads((folder / SCHEDULE).read_text(encoding="utf-8")))
    logger.info("resuming from %s (iteration %d)", folder, state["iteration"])
    return ResumePoint(
        folder=folder,
        iteration=int(state["iteration"]),
        prompts_consumed=tuple(state["prompts_consumed"]),
        schedule=schedule,
    )


def resume_point(plan: RunPlan) -> ResumePoint | None:
    """``load`` without ``finetune``: the checkpoint to resume; None for a fresh run."""
    if plan.checkpoint.resume_dir is None:
        return None
    return load_resume_point(Path(plan.checkpoint.resume_dir), run_fingerprint(plan))


# ---- the driver's side ---------------------------------------------------------------------------------
class Lineage:
    """The prompts consumed over the whole lineage of runs; what the next checkpoint carries.

    With ``log_path`` every step's prompt ids are also appended (and flushed) to a JSON-lines
    file, so a run killed at any point leaves the exact record of what it trained on."""

    def __init__(
        self,
        schedule: Sequence[ScheduledMinibatch],
        resumed: ResumePoint | None,
        log_path: Path | None = None,
    ) -> None:
        self.schedule = resumed.schedule if resumed is not None else tuple(schedule)
        self.start_iteration = resumed.iteration if resumed is not None else 0
        self.resumed_from_iteration = resumed.iteration if resumed is not None else None
        self._consumed = list(resumed.prompts_consumed) if resumed is not None else []
        self._log_path = log_path

    def record(self, iteration: int, prompt_ids: Sequence[str]) -> None:
        """The prompts 0-based ``iteration`` trained on."""
        self._consumed.extend(prompt_ids)
        if self._log_path is not None:
            with self._log_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"iteration": iteration, "prompt_ids": list(prompt_ids)}) + "\n")

    @property
    def num_consumed(self) -> int:
        """Prompts consumed over the lineage, counting a prompt drawn again in a later pass again."""
        return len(self._consumed)

    def state(self, iteration: int) -> PipelineState:
        return PipelineState(
            iteration=iteration,
            prompts_consumed=tuple(self._consumed),
            snapshot_version=iteration,
            resumed_from_iteration=self.resumed_from_iteration,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "resumed_from_iteration": self.resumed_from_iteration,
            "prompts_consumed_total": len(self._consumed),
            "prompts_consumed_unique_total": len(set(self._consumed)),
            "prompts_scheduled_total": sum(mb.num_prompts for mb in self.schedule),
        }


HOLD_MARKER = "HOLDING"
_HOLD_RELEASE = threading.Event()  # never set in a run: a held write ends with its process


def hold_before_commit(partial: Path) -> None:
    """Crash tests only: mark ``partial`` as fully written (``HOLD_MARKER``), then wait, never
    committing, until the test kills the process: a kill mid-write at a known point, not a timed one."""
    (partial / HOLD_MARKER).write_text(f"{os.getpid()}\n", encoding="utf-8")
    _HOLD_RELEASE.wait()


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpointer:
    """Saves the run's checkpoints (``spec``) through a TrainingUnit Ray handle."""

    spec: CheckpointSpec
    run_dir: Path
    fingerprint: Mapping[str, Any]
    lineage: Lineage
    extra_files: tuple[Path, ...] = ()
    hold_iteration: int | None = None
    """Crash tests only: the checkpoint after this many iterations stops before its commit
    (``hold_before_commit``) and waits there for the test to kill the run."""

    def maybe_save(self, iteration_index: int, trainer: Any) -> Path | None:
        """After 0-based ``iteration_index`` was trained (and recorded in the lineage)."""
        import ray

        if not self.spec.is_save_iteration(iteration_index):
            return None
        folder = self.spec.folder(self.run_dir, iteration_index)
        spec = self.spec
        held = self.hold_iteration is not None and iteration_index + 1 == self.hold_iteration
        return write_checkpoint(
            folder.parent,
            self.lineage.state(iteration_index + 1),
            schedule=self.lineage.schedule,
            fingerprint=self.fingerprint,
            write_trainer_state=lambda d: ray.get(
                trainer.save_state.remote(str(d), optimizer=spec.save_optim, rng=spec.save_rng)
            ),
            extra_files=self.extra_files,
            before_commit=hold_before_commit if held else None,
        )

    def restore(self, trainer: Any, resumed: ResumePoint | None) -> None:
        """Load the checkpoint's trainer state into ``trainer`` (before its first step)."""
        import ray

        if resumed is not None:
            opts = {"optimizer": self.spec.load_optim, "rng": self.spec.load_rng}
            ray.get(trainer.load_state.remote(str(resumed.folder), **opts))


def add_lineage_summary(run_dir: Path, lineage: Lineage) -> None:
    """Add the lineage's counts to ``summary.json``: ``prompts_scheduled`` becomes the lineage's
    schedule (the one the run resumed), ``prompts_scheduled_this_run`` what this run re-issued."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    extra = lineage.summary()
    summary["prompts_scheduled_this_run"] = summary["prompts_scheduled"]
    summary["prompts_scheduled"] = extra["prompts_scheduled_total"]
    summary.update(extra)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
