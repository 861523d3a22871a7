import numpy as np

from asp_scheduler.bench import TABLE6_ITERATIONS, table6, table6_loads
from asp_scheduler.synthetic import DISTRIBUTIONS


def test_table6_loads_are_sorted_minibatch_sums_of_clipped_lengths():
    loads = table6_loads("pareto", 500, seed=3, b=4)
    assert loads.shape == (500,)
    assert np.all(np.diff(loads) >= 0)  # sigma_0 is the pipeline's sorted order
    assert loads.max() <= 4 * 8192 and loads.min() >= 4
    assert np.array_equal(loads, table6_loads("pareto", 500, seed=3, b=4))


def test_table6_reports_every_family_and_budget_against_the_paper():
    rows = table6(num_minibatches=2000, seeds=1)
    assert set(rows) == set(DISTRIBUTIONS)
    for cells in rows.values():
        assert [c["n_max"] for c in cells] == list(TABLE6_ITERATIONS)
        reductions = [c["variance_reduction_pct"] for c in cells]
        assert all(0.0 < r <= 100.0 for r in reductions)
        assert all(c["diff"] == c["variance_reduction_pct"] - c["paper_pct"] for c in cells)
