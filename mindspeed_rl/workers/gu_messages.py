"""The typed records a Generation Unit and the Control Unit exchange (Ray actor calls).

::

    GU ── exchange(GuReport{reloads, conversions, start}, *completions) ──► CU
    GU ◄──────────────── GuPoll{assignments, latest snapshot, paused, decision, eval jobs} ──
    GU ── register_gu ──► CU ── GuFaultSettings ──► GU
    GU ── on_eval_done(job id, HeldOutDecode | error) ──► CU

Kept apart from ``control_unit.py`` so the GU side depends on the messages only, not on the
Control Unit's implementation. Plain frozen dataclasses: cheap to pickle, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindspeed_rl.runtime.minibatch_deadline import DeadlineSettings
from mindspeed_rl.runtime.records import Assignment, SnapshotInfo, StartDecision
from mindspeed_rl.workers.evaluator import EvalJob


@dataclass(frozen=True, slots=True, kw_only=True)
class GuPoll:
    """What a GU learns from one ``poll`` or ``exchange``: new work, the snapshot to reload to,
    the pause signal, and (``exchange`` only) the answer to its start request."""

    assignments: tuple[Assignment, ...]
    latest_snapshot: SnapshotInfo | None
    paused: bool
    finished: bool
    """Every scheduled prompt has been consumed: the GU may stop."""
    gu_known: bool
    """False once the GU was declared failed (it must stop: its work went elsewhere)."""
    seq: int
    """This answer's place among all answers to this GU (1, 2, ...). A poll answer and an exchange
    answer can reach the GU in the other order: it takes the signals of the newest only."""
    answered_at: float
    """When the answer was taken (``time.time()``): every snapshot published by then is in it."""
    decision: StartDecision | None = None
    """The CU's answer to the report's ``start`` request; ``None`` if it made none."""
    eval_jobs: tuple[EvalJob, ...] = ()
    """Evaluations the driver asked this GU to decode (``workers/evaluator.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRequest:
    """``ControlLoop.request_start`` for the queue head, as the GU's policy asked it."""

    minibatch_id: int
    attempt: int
    actor_id: int
    policy_version: int
    """The weights the actor holds now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadReport:
    """A finished reload (``ControlLoop.on_weights_loaded``)."""

    actor_id: int
    version: int
    seconds: float
    chosen_at: float
    """When the GU chose the target (``time.time()``): the reload is judged against what was
    published by then."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationReceipt:
    """What a generation actor tells its GU beside the samples (which go on unopened to the CU)."""

    minibatch_id: int
    held_version: int
    """The weights the actor holds after the minibatch: newer than its start version when a
    partial rollout reloaded mid-minibatch."""
    reloads: tuple[tuple[int, float], ...] = ()
    """(version, seconds) of each reload inside the minibatch (partial rollouts), oldest first."""
    max_tool_seconds: float = 0.0
    """Multi-turn: the largest tool seconds of one trajectory (its calls summed), which the
    minibatch deadline allows for beside the decode time (``runtime.minibatch_deadline``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversionReport:
    """A finished snapshot conversion (``ControlLoop.on_snapshot_converted``)."""

    version: int
    seconds: float
    finished_at: float
    """When it ended (``time.time()``): the GU reports it with its next call, maybe later."""
    delta: Mapping[str, float] | None = None
    """``weight_delta`` auto / on: the refresh's figures (``weights.delta_fs.DeltaApplier.last``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuReport:
    """Everything a GU tells the CU in one ``exchange`` (its finished minibatches travel beside it
    as top-level arguments, so Ray hands the actors' results over without the GU opening them)."""

    gu_id: int
    reloads: tuple[ReloadReport, ...] = ()
    conversions: tuple[ConversionReport, ...] = ()
    start: StartRequest | None = None
    """Applied after the completions and reports, so a just-freed actor may start at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuFaultSettings:
    """What ``register_gu`` tells a GU about handling its actors' faults (``RuntimeConfig``)."""

    deadlines: DeadlineSettings
    actor_max_restarts: int
