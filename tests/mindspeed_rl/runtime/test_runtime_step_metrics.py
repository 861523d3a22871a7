"""Per-step digests and the summary, read from ``ControlLoop.observe`` and the event log."""

from __future__ import annotations

import pytest
from runtime_fakes import complete, make_config, make_schedule

from mindspeed_rl.runtime import ControlLoop, EventLog, FakeClock
from mindspeed_rl.runtime.step_metrics import MetricsCursor, step_metrics


def _run_one_minibatch(loop: ControlLoop, clock: FakeClock) -> None:
    work = loop.dispatch()
    head = work[0]
    mb_id = head.minibatch.minibatch_id
    assert loop.request_start(mb_id, attempt=0, gu_id=0, actor_id=0, policy_version=0).granted
    clock.advance(2.0)
    n = loop.config.num_samples_per_prompt
    loop.on_minibatch_completed(
        complete(
            head, actor_id=0, policy_version=0, num_samples_per_prompt=n, started_at=0.0, finished_at=2.0
        )
    )


def test_digests_cover_only_their_window_and_reject_a_misaligned_observation() -> None:
    clock, events = FakeClock(), EventLog()
    loop = ControlLoop(config=make_config(), schedule=make_schedule(6), clock=clock, events=events)
    loop.register_gu(0, num_actors=1)
    cursor = MetricsCursor()
    _run_one_minibatch(loop, clock)
    first = step_metrics(loop.observe(), events, cursor)
    assert first["queue/arrivals"] == 1 and first["gen/minibatches"] == 1
    assert first["duty_cycle/actor0_0"] == 1.0
    seen = loop.observe(arrivals_since=cursor.num_arrivals, lag_steps_since=cursor.num_lag_steps)
    second = step_metrics(seen, events, cursor)
    assert second["queue/arrivals"] == 0 and second["gen/minibatches"] == 0
    assert second["queue/depth_samples_max"] == first["queue/depth_samples_now"] > 0
    with pytest.raises(ValueError, match="arrivals_since=cursor.num_arrivals"):
        step_metrics(loop.observe(), events, cursor)  # whole logs again: would double count


def test_summary_is_built_from_the_observation() -> None:
    clock = FakeClock()
    loop = ControlLoop(config=make_config(), schedule=make_schedule(6), clock=clock)
    loop.register_gu(0, num_actors=1)
    _run_one_minibatch(loop, clock)
    seen, summary = loop.observe(), loop.summary()
    assert summary.minibatches_completed == seen.minibatches_completed == 1
    assert summary.max_queue_depth_samples == seen.queue_depth_samples
    assert [(a.gu_id, a.actor_id, a.num_minibatches) for a in summary.actors] == [(0, 0, 1)]


def test_delta_figures_reach_the_step_digest_only_when_the_gus_report_them() -> None:
    """``weight_delta`` auto / on: a GU's conversion report carries its refresh's figures
    (``ControlLoop.on_snapshot_converted(delta=...)``); off reports none and adds no key."""
    clock, events = FakeClock(), EventLog()
    loop = ControlLoop(config=make_config(), schedule=make_schedule(6), clock=clock, events=events)
    loop.register_gu(0, num_actors=1)
    loop.register_gu(1, num_actors=1)
    cursor = MetricsCursor()
    loop.on_snapshot_converted(0, 1, 0.2)
    off = step_metrics(loop.observe(), events, cursor)
    assert not [k for k in off if k.startswith("delta/")]
    figures = {
        "delta_bytes_sent": 100.0,
        "delta_changed_fraction": 0.02,
        "delta_encode_seconds": 0.01,
        "delta_apply_seconds": 0.03,
    }
    loop.on_snapshot_converted(0, 1, 0.2, delta=figures)
    loop.on_snapshot_converted(1, 1, 0.2, delta={**figures, "delta_changed_fraction": 0.04})
    seen = loop.observe(arrivals_since=cursor.num_arrivals, lag_steps_since=cursor.num_lag_steps)
    on = step_metrics(seen, events, cursor)
    assert on["delta/bytes_sent"] == 200.0 and on["delta/refreshes"] == 2.0
    assert on["delta/changed_fraction"] == pytest.approx(0.03)
    assert on["delta/encode_s"] == pytest.approx(0.02) and on["delta/apply_s"] == pytest.approx(0.06)


def test_a_conversion_record_carries_delta_only_when_reported() -> None:
    from mindspeed_rl.runtime import events as ev

    plain = ev.SnapshotConverted(time=1.0, gu_id=0, version=2, seconds=0.5)
    assert ev.EventLog.to_json_dict(plain) == {
        "event": "SnapshotConverted", "time": 1.0, "gu_id": 0, "version": 2, "seconds": 0.5,
    }  # fmt: skip
    figures = {"delta_bytes_sent": 10.0}
    with_delta = ev.SnapshotConverted(time=1.0, gu_id=0, version=2, seconds=0.5, delta=figures)
    assert ev.EventLog.to_json_dict(with_delta)["delta"] == figures


def test_routing_bytes_are_counted_in_the_queue_the_digest_and_the_summary() -> None:
    """MoE routing replay (R3): the Training Queue counts the routing records its samples carry;
    the per-step digest reports the window's peak and the current bytes, the summary the peak and
    the mean per sample the trainer took. Samples of different lengths, so a wrong count shows."""
    import dataclasses

    import numpy as np

    from mindspeed_rl.runtime.routing import Routing

    clock, events = FakeClock(), EventLog()
    loop = ControlLoop(
        config=make_config(num_prompts_per_global_batch=2),
        schedule=make_schedule(6),
        clock=clock,
        events=events,
    )
    loop.register_gu(0, num_actors=1)
    cursor = MetricsCursor()
    assert "queue/routing_bytes_max" not in step_metrics(loop.observe(), events, cursor)  # no routing: no key
    head = loop.dispatch()[0]
    assert loop.request_start(
        head.minibatch.minibatch_id, attempt=0, gu_id=0, actor_id=0, policy_version=0
    ).granted
    done = complete(head, actor_id=0, policy_version=0, num_samples_per_prompt=2, finished_at=2.0)
    # 2 MoE layers x top-2 of 4 experts: 4 uint8 bytes per position; positions grow per sample.
    positions = [5 + i for i in range(len(done.samples))]
    rng = np.random.default_rng(0)
    samples = tuple(
        dataclasses.replace(s, routing=Routing.from_array(rng.integers(0, 4, size=(p, 2, 2)), num_experts=4))
        for s, p in zip(done.samples, positions)
    )
    loop.on_minibatch_completed(dataclasses.replace(done, samples=samples))
    queued = sum(positions) * 4
    assert loop.queue.routing_bytes == queued
    seen = loop.observe(arrivals_since=cursor.num_arrivals, lag_steps_since=cursor.num_lag_steps)
    digest = step_metrics(seen, events, cursor)
    assert digest["queue/routing_bytes_max"] == digest["queue/routing_bytes_now"] == queued
    assert loop.observe().routing_bytes_per_sample is None  # nothing trained yet
    batch = loop.pop_global_batch(0)
    assert batch is not None
    taken = sum(s.routing_bytes for s in batch.samples)
    assert taken == 4 * sum(s.routing.positions for s in batch.samples if s.routing is not None)
    loop.on_train_step_done(0)
    seen = loop.observe(arrivals_since=cursor.num_arrivals, lag_steps_since=cursor.num_lag_steps)
    digest = step_metrics(seen, events, cursor)
    # No arrival since: the window's peak is what the queue held when it started.
    assert digest["queue/routing_bytes_max"] == queued
    assert digest["queue/routing_bytes_now"] == queued - taken == loop.queue.routing_bytes
    summary = loop.summary().to_dict()
    assert summary["max_queue_routing_bytes"] == queued
    assert summary["routing_bytes_per_sample"] == taken / len(batch.samples)
