"""Wall time of one online re-plan (DP minibatches + SA batch groups) at batch to epoch scale.

    python benchmarks/online_replan.py [--json runs/online_replan.json]

Tails of 128 to 100,000 prompts with log-normal estimates; the preset's scheduler settings
(b=4, kappa=1, k=6, 2e6 SA iterations) and the paper's (b=32, kappa=2, k=6). Median of 5 calls
after one warm-up (numba compiles on the first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_scheduler.online import replan
from asp_scheduler.params import ScheduleParams


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    for label, params in (
        ("preset b=4 kappa=1 k=6", ScheduleParams(b=4, kappa=1, k=6)),
        ("paper b=32 kappa=2 k=6", ScheduleParams(b=32, kappa=2, k=6)),
    ):
        for n in (128, 1536, 100_000):
            est = np.random.default_rng(0).lognormal(8.6, 0.5, n)
            replan(est, params)
            walls = [replan(est, params).wall_seconds for _ in range(5)]
            rows.append({"params": label, "num_prompts": n, "wall_s_median": statistics.median(walls)})
            print(f"{label:24s} {n:>7d} prompts: {1e3 * rows[-1]['wall_s_median']:.1f} ms")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
