"""Scheduler benchmarks: SA throughput, end-to-end time at 10^7 items, and the paper's Table 6.

Table 6 protocol (paper App. E.4): N_B = 10^5 minibatch loads, k = 10, C = 1, variance
reduction ``1 - V(sigma_nmax) / V(sigma_0)``. The paper does not say how the loads were made;
we feed SA what the pipeline itself hands it: ``N_B * b`` i.i.d. lengths (b = 32, each clipped
at 8,192) are sorted and cut into consecutive size-b minibatches (Algorithm 1 returns all-b
minibatches on such inputs), and sigma_0 is that sorted dispatch order. Loads therefore keep the
length distribution's shape (heavy tails stay heavy, which is what leaves Pareto short of 100%),
and the sorted start explains why the early columns barely depend on the distribution.
Alternatives we measured and rejected (seed 0, same family parameters): a random sigma_0 with
one clipped length per load gives Pareto 18/70/86/90% (paper 30.5/92.2/97.2/97.8); sums of 32
unsorted lengths average the tails away, so every family ends at 100%.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from asp_scheduler.ordering import _anneal, anneal_order, group_deviations
from asp_scheduler.schedule import build_schedule
from asp_scheduler.synthetic import DISTRIBUTIONS, draw_lengths

TABLE6_ITERATIONS = (10_000, 89_000, 270_000, 2_400_000)
TABLE6_PAPER = {
    "lognormal": (30.6, 93.9, 98.9, 99.4),
    "exponential": (29.8, 95.6, 99.9, 100.0),
    "pareto": (30.5, 92.2, 97.2, 97.8),
    "bimodal": (29.6, 95.6, 99.8, 100.0),
}


def pin_to_one_core() -> int:
    """Restrict this process to its first allowed CPU so throughput is per core."""
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def table6_loads(distribution: str, num_minibatches: int, seed: int, b: int = 32) -> np.ndarray:
    """Loads of length-sorted size-``b`` minibatches, in sorted (= sigma_0) order."""
    lengths = np.sort(draw_lengths(distribution, num_minibatches * b, np.random.default_rng(seed)))
    return lengths.reshape(num_minibatches, b).sum(axis=1)


def sa_throughput(num_iterations: int = 20_000_000, repeats: int = 5) -> dict[str, float]:
    """Median iterations/s of the SA kernel alone (wall and CPU clocks), N_B = 10^5, k = 10."""
    loads = table6_loads("lognormal", 100_000, seed=0)
    walls, cpus = [], []
    for r in range(repeats + 1):
        pos = loads.copy()
        perm = np.arange(pos.size)
        dev = group_deviations(pos, 10, pos.mean())
        w0, c0 = time.perf_counter(), time.process_time()
        _anneal(pos, perm, dev, 10, num_iterations if r else 1000, 1.0, 1e-4, r)
        if r:  # r == 0 only triggers compilation / cache load
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    return {
        "sa_iterations_per_s": num_iterations / statistics.median(walls),
        "sa_iterations_per_s_cpu_clock": num_iterations / statistics.median(cpus),
    }


def schedule_end_to_end(num_items: int = 10_000_000) -> tuple[float, float]:
    """(wall, CPU) seconds for sort + DP + 2x10^6 SA iterations + split on ``num_items`` items."""
    lengths = draw_lengths("lognormal", num_items, np.random.default_rng(1)).astype(np.float64)
    lengths += np.random.default_rng(2).random(num_items)  # break ties like real predictions
    build_schedule(lengths[:5000])  # compile outside the timed region
    wall, cpu = time.perf_counter(), time.process_time()
    build_schedule(lengths)
    return time.perf_counter() - wall, time.process_time() - cpu


def table6(num_minibatches: int = 100_000, seeds: int = 3) -> dict[str, object]:
    rows: dict[str, object] = {}
    for dist in DISTRIBUTIONS:
        cells = []
        loads = [table6_loads(dist, num_minibatches, s) for s in range(seeds)]
        for n_max, paper in zip(TABLE6_ITERATIONS, TABLE6_PAPER[dist]):
            reductions = [
                100.0 * anneal_order(loads[s], 10, num_iterations=n_max, seed=s).variance_reduction
                for s in range(seeds)
            ]
            ours = float(np.mean(reductions))
            cells.append(
                {"n_max": n_max, "variance_reduction_pct": ours, "paper_pct": paper, "diff": ours - paper}
            )
        rows[dist] = cells
    return rows


def run_bench() -> dict[str, object]:
    core = pin_to_one_core()
    out: dict[str, object] = {"core": core}
    out.update(sa_throughput())
    out["schedule_1e7_s"], out["schedule_1e7_cpu_s"] = schedule_end_to_end()
    out["table6"] = table6()
    return out
