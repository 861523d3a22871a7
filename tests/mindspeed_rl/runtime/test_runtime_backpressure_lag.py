from __future__ import annotations

import pytest

from mindspeed_rl.runtime import FakeClock, StartRefusal
from mindspeed_rl.runtime.backpressure import Backpressure
from mindspeed_rl.runtime.lag_budget import LagBudget
from mindspeed_rl.runtime.timings import ActorActivityLog, TimingStats, WeightFlowTimings, eq4_d_off_estimate


def test_backpressure_pauses_above_max_and_resumes_only_at_resume_level() -> None:
    clock = FakeClock()
    bp = Backpressure(max_samples=10, resume_samples=4, clock=clock)
    assert bp.update(10) is None and not bp.paused  # at the limit is still fine
    assert bp.update(11) is True and bp.paused
    clock.advance(3.0)
    for depth in (12, 9, 5, 11):  # inside the hysteresis band nothing flips
        assert bp.update(depth) is None and bp.paused
    clock.advance(2.0)
    assert bp.seconds_paused == pytest.approx(5.0)  # includes the open pause
    assert bp.update(4) is False and not bp.paused
    clock.advance(10.0)
    assert bp.update(8) is None and not bp.paused
    assert bp.num_pauses == 1 and bp.seconds_paused == pytest.approx(5.0)
    with pytest.raises(ValueError, match="below the pause threshold"):
        Backpressure(max_samples=4, resume_samples=4, clock=clock)


def test_lag_budget_admits_starts_only_while_every_deadline_stays_feasible() -> None:
    budget = LagBudget(max_policy_lag=1, prompts_per_step=2)
    # Version 0, deadline step 1: steps 0 and 1 hold 4 prompts.
    assert budget.check_start(3, policy_version=0) is None
    budget.reserve(3, policy_version=0)
    assert budget.check_start(2, policy_version=0) is StartRefusal.POLICY_LAG
    assert budget.check_start(1, policy_version=0) is None
    assert budget.check_start(5, policy_version=0) is StartRefusal.STALE_WEIGHTS  # never fits
    budget.consume([1, 1])  # step 0 takes two of them
    assert budget.next_step == 1
    assert budget.check_start(1, policy_version=0) is None
    budget.release(3 - 2, policy_version=0)  # the last one failed
    assert budget.check_start(1, policy_version=1) is None


def test_lag_budget_holds_the_trainer_while_a_due_prompt_is_still_generating() -> None:
    # The case arrival order alone gets wrong: L=2, one prompt per step, three version-0 starts.
    budget = LagBudget(max_policy_lag=2, prompts_per_step=1)
    for _ in range(3):
        assert budget.check_start(1, policy_version=0) is None
        budget.reserve(1, policy_version=0)
    assert budget.check_start(1, policy_version=0) is StartRefusal.POLICY_LAG
    budget.consume([2])  # step 0: the first arrival
    budget.reserve(1, policy_version=1)  # deadline 3
    # Step 1: only the version-1 prompt has arrived; taking it would leave two prompts due at
    # step 2 with one slot, so the trainer must wait for a version-0 straggler instead.
    assert not budget.can_consume([3])
    assert budget.can_consume([2])


def test_unbounded_lag_budget_never_refuses() -> None:
    budget = LagBudget(max_policy_lag=None, prompts_per_step=1)
    assert budget.deadline(0) is None
    budget.reserve(100, policy_version=0)
    assert budget.check_start(100, policy_version=0) is None
    assert budget.can_consume([None])


def test_eq4_estimate_reproduces_the_papers_breakdown() -> None:
    paper = WeightFlowTimings(t_save=23.5, t_convert=84.6, t_load=73.9, t_gen=763.3, t_train=287.6)
    assert eq4_d_off_estimate(0.0, paper) == pytest.approx(3.287, abs=1e-3)
    assert eq4_d_off_estimate(2.0, paper) == pytest.approx(5.287, abs=1e-3)
    with pytest.raises(ValueError, match="positive T_train"):
        eq4_d_off_estimate(0.0, WeightFlowTimings(t_save=0, t_convert=0, t_load=0, t_gen=1, t_train=0))


def test_timing_stats_need_generation_and_training_before_estimating() -> None:
    stats = TimingStats()
    stats.gen.add(10.0)
    assert stats.current() is None
    stats.train.add(4.0)
    stats.train.add(6.0)
    current = stats.current()
    assert current is not None and (current.t_gen, current.t_train, current.t_load) == (10.0, 5.0, 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        stats.load.add(-1.0)


def test_duty_cycle_is_generating_over_generating_plus_loading() -> None:
    log = ActorActivityLog()
    log.on_generated(0, 1, started_at=10.0, finished_at=773.3)
    log.on_loaded(0, 1, seconds=73.9, finished_at=850.0)
    actor = log.actors[(0, 1)]
    assert actor.duty_cycle == pytest.approx(0.912, abs=1e-3)  # the paper's η for its breakdown
    assert actor.busy_fraction(now=1010.0) == pytest.approx(763.3 / 1000.0)
    assert ActorActivityLog().actors == {}
