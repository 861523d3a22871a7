"""Per-step observability of the async pipeline, from the ControlLoop's read-out and event log.

One digest per trainer step, covering everything that happened since the previous digest:
Training Queue depth at arrivals, time paused by backpressure, per-GU / per-actor minibatch
counts and generation times, snapshot save / convert / load times, measured ``d_off`` next to
the Eq. 4 estimate, and the duty cycle η of every actor (cumulative, as the paper reports it).
Key names match ``mindspeed_rl.utils.plots.DEFAULT_PANELS``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from mindspeed_rl.runtime import events as ev
from mindspeed_rl.runtime.observation import LoopObservation


@dataclass(slots=True)
class MetricsCursor:
    """How far the previous digest read (indices into the loop's append-only logs).

    Pass ``num_arrivals`` / ``num_lag_steps`` to ``ControlLoop.observe`` as the ``*_since``
    offsets, so the observation carries only the window's arrivals and lag steps."""

    num_events: int = 0
    num_arrivals: int = 0
    num_lag_steps: int = 0
    seconds_paused: float = 0.0
    # Queue depth when the previous digest was taken: the window's starting depth.
    depth_samples: int = 0
    # Likewise the routing bytes the queue held then (MoE routing replay).
    routing_bytes: int = 0


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def step_metrics(seen: LoopObservation, events: ev.EventLog, cursor: MetricsCursor) -> dict[str, float]:
    """The digest since ``cursor`` (advanced); ``seen`` observed with the cursor's offsets."""
    if seen.num_arrivals - len(seen.arrivals) != cursor.num_arrivals or (
        seen.num_lag_steps - len(seen.lag_steps) != cursor.num_lag_steps
    ):
        raise ValueError(
            "observation does not start at the cursor: call ControlLoop.observe("
            "arrivals_since=cursor.num_arrivals, lag_steps_since=cursor.num_lag_steps)."
        )
    new_events = events.since(cursor.num_events)
    arrivals, lags = seen.arrivals, seen.lag_steps
    out: dict[str, float | None] = {
        "queue/depth_samples_mean": _mean([float(a.depth_samples_after) for a in arrivals]),
        # Only arrivals raise the depth, so the window's peak is its starting depth or a depth
        # right after an arrival. A step served entirely from samples queued earlier has no
        # arrivals, yet the queue still held those samples: the max is then the starting depth.
        "queue/depth_samples_max": float(
            max([cursor.depth_samples, *(a.depth_samples_after for a in arrivals)])
        ),
        "queue/depth_samples_now": float(seen.queue_depth_samples),
        "queue/arrivals": float(len(arrivals)),
        "backpressure/seconds_paused": seen.seconds_paused - cursor.seconds_paused,
        "backpressure/paused": float(seen.paused),
        "lag/d_off_mean": _mean([s.d_off_mean for s in lags]),
        "lag/d_off_max": max((float(s.d_off_max) for s in lags), default=None),
        # A sample's policy_version IS its oldest token's (Sample checks it against its segments).
        "lag/oldest_token_max": max((float(s.d_off_max) for s in lags), default=None),
        "rollout/partial_samples": float(sum(s.split_samples for s in lags)) if lags else None,
        "rollout/max_segments": max((float(s.max_segments) for s in lags), default=None),
        "lag/d_off_eq4": _mean([s.d_off_estimate_mean for s in lags if s.d_off_estimate_mean is not None]),
        "lag/policy_version": float(seen.latest_version),
    }
    if seen.max_queue_routing_bytes:  # MoE routing replay (R3) records routing; otherwise all 0
        # As for the depth: the window's peak is its starting value or a value right after an arrival.
        out["queue/routing_bytes_max"] = float(
            max([cursor.routing_bytes, *(a.routing_bytes_after for a in arrivals)])
        )
        out["queue/routing_bytes_now"] = float(seen.queue_routing_bytes)
    out.update(_generation(new_events))
    out.update(_weight_flow(new_events))
    out.update(_duty_cycles(seen))
    cursor.num_events += len(new_events)
    cursor.num_arrivals = seen.num_arrivals
    cursor.num_lag_steps = seen.num_lag_steps
    cursor.seconds_paused = seen.seconds_paused
    cursor.depth_samples = seen.queue_depth_samples
    cursor.routing_bytes = seen.queue_routing_bytes
    # MetricsWriter accepts numbers only; a metric with nothing to report this step is omitted.
    return {k: v for k, v in out.items() if v is not None}


def _generation(events: list[ev.Event]) -> dict[str, float]:
    per_gu: defaultdict[int, int] = defaultdict(int)
    per_actor: defaultdict[str, list[float]] = defaultdict(list)
    dropped = 0
    for e in events:
        if not isinstance(e, ev.MinibatchReceived):
            continue
        if e.outcome != "accepted":
            dropped += 1
            continue
        per_gu[e.gu_id] += 1
        per_actor[f"{e.gu_id}_{e.actor_id}"].append(e.generation_seconds)
    out: dict[str, float] = {"gen/minibatches_dropped": float(dropped)}
    out.update({f"gen/gu{g}/minibatches": float(n) for g, n in sorted(per_gu.items())})
    for key, seconds in sorted(per_actor.items()):
        out[f"gen/actor{key}/minibatches"] = float(len(seconds))
        out[f"gen/actor{key}/gen_s_mean"] = sum(seconds) / len(seconds)
    out["gen/minibatches"] = float(sum(per_gu.values()))
    out["requeued_minibatches"] = float(sum(isinstance(e, ev.MinibatchRequeued) for e in events))
    return out


def _weight_flow(events: list[ev.Event]) -> dict[str, float | None]:
    saves = [
        e.save_seconds for e in events if isinstance(e, ev.SnapshotPublished) and e.save_seconds is not None
    ]
    converts = [e.seconds for e in events if isinstance(e, ev.SnapshotConverted)]
    loads = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    return {
        **_delta(events),
        "snapshot/save_s": _mean(saves),
        "snapshot/convert_s": _mean(converts),
        "snapshot/load_s": _mean([e.seconds for e in loads]),
        "snapshot/reloads": float(len(loads)),
        "snapshot/reloads_not_newest": float(
            sum(e.newest_at_start is not None and e.version < e.newest_at_start for e in loads)
        ),
    }


def _delta(events: list[ev.Event]) -> dict[str, float | None]:
    """``weight_delta`` auto / on: the step's refreshes as the GUs applied them (nothing when off).
    Bytes and seconds are summed over the step's conversions, the changed fraction averaged."""
    deltas = [e.delta for e in events if isinstance(e, ev.SnapshotConverted) and e.delta is not None]
    if not deltas:
        return {}
    return {
        "delta/bytes_sent": sum(d["delta_bytes_sent"] for d in deltas),
        "delta/changed_fraction": _mean([d["delta_changed_fraction"] for d in deltas]),
        "delta/encode_s": sum(d["delta_encode_seconds"] for d in deltas),
        "delta/apply_s": sum(d["delta_apply_seconds"] for d in deltas),
        "delta/refreshes": float(len(deltas)),
    }


def _duty_cycles(seen: LoopObservation) -> dict[str, float]:
    out: dict[str, float] = {}
    cycles: list[float] = []
    busy: list[float] = []
    for actor in seen.actors:
        if actor.duty_cycle is not None:
            out[f"duty_cycle/actor{actor.gu_id}_{actor.actor_id}"] = actor.duty_cycle
            cycles.append(actor.duty_cycle)
        if actor.busy_fraction is not None:
            busy.append(actor.busy_fraction)
    if cycles:
        out["duty_cycle_mean"] = sum(cycles) / len(cycles)
    if busy:
        out["busy_fraction_mean"] = sum(busy) / len(busy)
    return out
