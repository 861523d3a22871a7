"""condition_schedules: every condition is a Schedule over the same items, grouped by one rule."""

from dataclasses import replace

import numpy as np

from asp_scheduler import ScheduleParams, build_schedule
from asp_scheduler.ablation import condition_schedules, run_ablation


def test_every_condition_covers_the_items_and_groups_k_consecutive_minibatches():
    pred = np.random.default_rng(0).lognormal(6, 1, 130)
    params = ScheduleParams(b=8, kappa=2, k=3, sa_iterations=5000, seed=2)
    ids = [f"p{i}" for i in range(130)]
    built = condition_schedules(pred, params, pred * 1.1, item_ids=ids)
    assert set(built) == {"C0", "C1", "C2", "C3", "C4", "C4_calibrated"}
    for name, s in built.items():
        assert np.array_equal(np.sort(np.concatenate(s.minibatches)), np.arange(130)), name
        assert s.batch_group_ids.tolist() == [i // 3 for i in range(len(s.minibatches))], name
        assert s.item_ids == ids
    assert [m.tolist() for m in built["C0"].minibatches[:2]] == [list(range(8)), list(range(8, 16))]
    explicit = build_schedule(pred, params, item_ids=ids)
    assert all(np.array_equal(a, b) for a, b in zip(built["C4"].minibatches, explicit.minibatches))
    assert built["C1"].params.sa_iterations == 0 and built["C4_calibrated"].params.calibrate_loads


def test_seeds_start_at_params_seed():
    lengths = np.random.default_rng(1).lognormal(6, 0.7, 96).round() + 1
    params = ScheduleParams(b=8, kappa=0, k=2, sa_iterations=2000)
    from_zero = run_ablation(lengths, [0.7], 2, params)["results"][0]["per_seed"]  # type: ignore[index]
    from_one = run_ablation(lengths, [0.7], 1, replace(params, seed=1))["results"][0]["per_seed"]  # type: ignore[index]
    assert [s["seed"] for s in from_zero] == [0, 1]
    assert from_one[0] == from_zero[1]
