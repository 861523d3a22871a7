import itertools

import numpy as np
import pytest

from asp_scheduler.minibatch import fixed_size_endpoints, is_representable, partition_sorted


def _score(lengths, sizes, objective):
    total, start = 0.0, 0
    for size in sizes:
        chunk = lengths[start : start + size]
        slots = size * chunk[-1]
        total += chunk.sum() / slots if objective == "utilization" else -(slots - chunk.sum())
        start += size
    return total


def _brute_force(lengths, b, kappa, objective):
    """Best score over all compositions of n (at most one part below b, only if unavoidable)."""
    n = lengths.size
    feasible = is_representable(n, b, kappa)
    best = -np.inf
    for parts in range(1, n + 1):
        for sizes in itertools.product(range(1, b + kappa + 1), repeat=parts):
            if sum(sizes) != n:
                continue
            short = sum(s < b for s in sizes)
            if (feasible and short) or short > 1:
                continue
            best = max(best, _score(lengths, sizes, objective))
        if parts * b > n + b:
            break
    return best


@pytest.mark.parametrize("objective", ["utilization", "padded_slots"])
def test_dp_matches_brute_force_on_random_small_cases(objective):
    rng = np.random.default_rng(0)
    for _ in range(40):
        b = int(rng.integers(1, 4))
        kappa = int(rng.integers(0, 3))
        n = int(rng.integers(b, 10))
        lengths = np.sort(rng.integers(1, 50, size=n).astype(float))
        part = partition_sorted(lengths, b, kappa, objective=objective)
        assert part.objective_value == pytest.approx(_brute_force(lengths, b, kappa, objective))
        assert _score(lengths, part.sizes, objective) == pytest.approx(part.objective_value)


def test_sizes_stay_in_bounds_and_cover_every_item():
    lengths = np.sort(np.random.default_rng(1).lognormal(7, 1, 5000))
    part = partition_sorted(lengths, 32, 2)
    assert part.endpoints[0] == 0 and part.endpoints[-1] == 5000
    assert np.all((part.sizes >= 32) & (part.sizes <= 34))
    assert part.num_short_minibatches == 0


def test_unrepresentable_n_gets_exactly_one_short_minibatch():
    lengths = np.sort(np.random.default_rng(2).random(50))  # 50 is not a sum of sizes in [32, 34]
    part = partition_sorted(lengths, 32, 2)
    assert part.num_short_minibatches == 1
    assert part.sizes.sum() == 50
    assert np.sum(part.sizes < 32) == 1 and np.all(part.sizes <= 34)


def test_fewer_items_than_b_is_an_error_unless_allowed():
    with pytest.raises(ValueError, match="allow_small"):
        partition_sorted(np.arange(1.0, 6.0), 8, 2)
    part = partition_sorted(np.arange(1.0, 6.0), 8, 2, allow_small=True)
    assert part.sizes.tolist() == [5]


@pytest.mark.parametrize(("b", "kappa"), [(0, 2), (-1, 2), (4, -1)])
def test_bad_sizes_are_rejected(b, kappa):
    with pytest.raises(ValueError, match="b|kappa"):
        partition_sorted(np.arange(1.0, 40.0), b, kappa)


def test_unsorted_and_empty_input_are_rejected():
    with pytest.raises(ValueError, match="sorted"):
        partition_sorted(np.array([3.0, 1.0, 2.0]), 1, 0)
    with pytest.raises(ValueError, match="zero items"):
        partition_sorted(np.array([]), 1, 0)


def test_fixed_size_endpoints_keep_the_remainder():
    assert fixed_size_endpoints(10, 4).tolist() == [0, 4, 8, 10]
