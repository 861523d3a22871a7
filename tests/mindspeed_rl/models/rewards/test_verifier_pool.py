"""Verifier timeout and parallel verification: a hung verifier scores 0, is counted, and is killed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mindspeed_rl.models.rewards import (
    RewardConfig,
    build_reward_fn,
    register_verifier,
    unregister_verifier,
)
from mindspeed_rl.models.rewards.pool import VerifierError, VerifierPool

TIMEOUT_S = 0.3


def _hangs_on_loop(response: str, label: str) -> float:
    if "loop" in response:
        threading.Event().wait()  # never set: only the pool's kill ends this call
    return 1.0 if response == label else 0.0


def _raises(response: str, label: str) -> float:
    raise KeyError(f"bad label {label}")


@pytest.fixture
def hanging_verifier():
    register_verifier("test_hangs", _hangs_on_loop)
    yield "test_hangs"
    unregister_verifier("test_hangs")


def _config(names, weights, *, parallel=1, timeout=TIMEOUT_S) -> RewardConfig:
    return RewardConfig(
        verifier_function=tuple(names),
        verifier_weight=tuple(weights),
        verifier_parallel=parallel,
        verifier_timeout=timeout,
    )


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_hanging_verifier_scores_zero_is_counted_and_the_call_returns_without_it(
    hanging_verifier, parallel
):
    """The hanging verifier never returns (it waits on an event nobody sets), so the call coming
    back at all, with the two hung responses marked, proves the pool gave up on them at the
    timeout; no wall-clock bound needed (the suite's per-test timeout catches a regression)."""
    responses = ["a", "loop", "b", "c", "loop", "d"]
    labels = ["a", "x", "b", "x", "y", "d"]
    with build_reward_fn(_config([hanging_verifier, "format"], [1.0, 0.5], parallel=parallel)) as reward_fn:
        result = reward_fn(responses, labels)
        pool = reward_fn._pool
        assert pool is not None
        workers = [w.process for w in pool._workers]
        # Both hung workers were replaced: a full set of live workers, none still stuck.
        assert len(workers) == parallel and all(p.is_alive() for p in workers)
    assert result.num_timed_out == 2
    np.testing.assert_array_equal(result.per_verifier[hanging_verifier], [1, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(result.rewards, [1, 0, 1, 0, 0, 1])


def test_a_hung_worker_is_killed_and_replaced_not_leaked(hanging_verifier):
    pool = VerifierPool([_hangs_on_loop], num_workers=1, timeout=TIMEOUT_S)
    pool.score([("a", "a")])
    (first,) = [w.process for w in pool._workers]
    result = pool.score([("loop", "a"), ("a", "a")])
    assert result.timed_out.tolist() == [True, False] and result.scores[:, 0].tolist() == [0.0, 1.0]
    assert not first.is_alive() and first.exitcode is not None
    (second,) = [w.process for w in pool._workers]
    assert second.pid != first.pid and second.is_alive()
    pool.close()
    assert not second.is_alive()


def test_parallel_verification_gives_the_serial_rewards():
    responses = [
        "<think>\nhalf\n</think>\nThe answer is \\boxed{\\frac{1}{2}}.",
        "\\boxed{2}",
        "<think>\nguess\n</think>\n\\boxed{7}",
        "<think>\nsum\n</think>\n\\boxed{3}",
        "no box at all",
        "\\boxed{x^2}",
    ] * 3
    labels = ["0.5", "3", "8", "3", "1", "x^2"] * 3
    names, weights = ["acc", "math_verify_reward", "format"], [1.0, 0.5, 0.25]
    with build_reward_fn(_config(names, weights, parallel=1, timeout=10.0)) as serial:
        expected = serial(responses, labels)
    with build_reward_fn(_config(names, weights, parallel=3, timeout=10.0)) as parallel:
        got = parallel(responses, labels)
    assert expected.num_timed_out == got.num_timed_out == 0
    np.testing.assert_array_equal(got.rewards, expected.rewards)
    for name in names:
        np.testing.assert_array_equal(got.per_verifier[name], expected.per_verifier[name])
    assert expected.rewards[:6].tolist() == [1.75, 0.0, 0.25, 1.75, 0.0, 1.5]


def test_an_error_inside_a_worker_surfaces_with_its_traceback():
    register_verifier("test_raises", _raises)
    try:
        with build_reward_fn(_config(["test_raises"], [1.0])) as reward_fn:
            with pytest.raises(VerifierError, match="KeyError: 'bad label 7'"):
                reward_fn(["r"], ["7"])
            # The pool recovers: the next call gets fresh workers, not the failed call's leftovers.
            with pytest.raises(VerifierError):
                reward_fn(["r"], ["7"])
    finally:
        unregister_verifier("test_raises")


def test_bounded_verifiers_run_in_process_without_a_pool():
    reward_fn = build_reward_fn(_config(["demo", "format"], [1.0, 0.1]))
    assert reward_fn._pool is None
    assert reward_fn(["aaa"], ["aaa"]).rewards.tolist() == [1.0]


@pytest.mark.parametrize(
    ("parallel", "timeout", "match"),
    [(0, 1.0, "verifier_parallel=0"), (1, 0.0, "verifier_timeout=0.0"), (1, -1.0, "verifier_timeout")],
)
def test_bad_parallel_or_timeout_is_rejected(parallel, timeout, match):
    with pytest.raises(ValueError, match=match):
        build_reward_fn(_config(["acc"], [1.0], parallel=parallel, timeout=timeout))


def test_registering_a_taken_name_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("acc", _raises)


_WARM: list[int] = []


def _needs_warm_up(response: str, label: str) -> float:
    # Without the parent's warm-up the forked worker would have to pay for it (here: never done).
    return 1.0 if _WARM else 0.0


def test_warm_ups_run_once_in_the_parent_and_workers_inherit_their_state():
    pool = VerifierPool([_needs_warm_up], num_workers=2, timeout=5.0, warm_ups=[lambda: _WARM.append(1)])
    try:
        assert pool.score([("a", "a"), ("b", "b")]).scores[:, 0].tolist() == [1.0, 1.0]
        pool.score([("c", "c")])
        assert _WARM == [1]
    finally:
        pool.close()
        _WARM.clear()
