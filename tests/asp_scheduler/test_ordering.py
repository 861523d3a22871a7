import numpy as np
import pytest

from asp_scheduler.ordering import _anneal, anneal_order, group_deviations, objective


def _full_objective(loads, perm, k):
    pos = loads[perm]
    num_groups = -(-pos.size // k)
    group_sizes = np.bincount(np.arange(pos.size) // k, minlength=num_groups)
    group_loads = np.bincount(np.arange(pos.size) // k, weights=pos, minlength=num_groups)
    dev = group_loads - group_sizes * pos.mean()
    return float(np.sum(dev**2) / num_groups)


@pytest.mark.parametrize(("n", "k"), [(60, 6), (61, 6), (200, 7), (2, 6)])
def test_incremental_deviations_equal_full_recomputation(n, k):
    loads = np.random.default_rng(n).lognormal(9, 1, n)
    pos, perm = loads.copy(), np.arange(n)
    dev = group_deviations(pos, k, pos.mean())
    # Hot temperature so uphill moves are accepted too: every delta branch is exercised.
    accepted = _anneal(pos, perm, dev, k, 5000, 1e-9, 1.0 / dev.size, 3)
    assert accepted > 0
    np.testing.assert_allclose(pos, loads[perm])
    np.testing.assert_allclose(dev, group_deviations(loads[perm], k, loads.mean()), atol=1e-6 * loads.sum())
    assert objective(loads[perm], k) == pytest.approx(_full_objective(loads, perm, k))


def test_sa_never_ends_worse_and_is_a_permutation():
    rng = np.random.default_rng(0)
    for trial in range(10):
        loads = rng.exponential(1000, int(rng.integers(5, 300)))
        res = anneal_order(loads, 6, num_iterations=20_000, c=float(rng.choice([0.0, 1.0, 1e9])), seed=trial)
        assert res.final_objective <= res.initial_objective
        assert sorted(res.permutation.tolist()) == list(range(loads.size))
        assert res.final_objective == pytest.approx(_full_objective(loads, res.permutation, 6))


def test_sa_is_deterministic_per_seed_and_seed_matters():
    loads = np.random.default_rng(1).lognormal(8, 1, 500)
    a = anneal_order(loads, 6, num_iterations=50_000, seed=4)
    b = anneal_order(loads, 6, num_iterations=50_000, seed=4)
    c = anneal_order(loads, 6, num_iterations=50_000, seed=5)
    assert np.array_equal(a.permutation, b.permutation)
    assert not np.array_equal(a.permutation, c.permutation)


def test_sa_balances_groups():
    loads = np.sort(np.random.default_rng(2).lognormal(8, 0.5, 600))  # sorted: worst start
    res = anneal_order(loads, 6, num_iterations=500_000, seed=0)
    assert res.variance_reduction > 0.99


def test_partial_last_group_target_is_proportional_to_its_size():
    # 7 equal loads, k = 3: groups of 3, 3, 1 are all exactly on target, so V = 0.
    assert objective(np.full(7, 5.0), 3) == 0.0


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="k"):
        anneal_order(np.ones(4), 0)
    with pytest.raises(ValueError, match="non-empty"):
        anneal_order(np.array([]), 2)
    with pytest.raises(ValueError, match="finite"):
        anneal_order(np.array([1.0, np.nan]), 2)
