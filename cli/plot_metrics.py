"""Render a run's metrics as PNG: ``python cli/plot_metrics.py runs/<run>``."""

from __future__ import annotations

import argparse
import sys

from mindspeed_rl.utils.plots import render_plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default: <run_dir>/metrics.png)")
    args = parser.parse_args(argv)
    try:
        out = render_plots(args.run_dir, args.out)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
