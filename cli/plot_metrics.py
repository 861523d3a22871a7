"""Render a run's metrics as PNG: ``python cli/plot_metrics.py runs/<run>``.

Writes ``<run>/plots/*.png`` (reward, eval accuracy, tokens/s, queue depth, lag, per-GU duty cycle:
what the run itself writes when it ends, for runs made before that or still going) and one
overview ``<run>/metrics.png`` (``--out`` elsewhere); prints the paths.
"""

from __future__ import annotations

import argparse
import sys

from mindspeed_rl.utils.plots import render_plots, write_run_plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="overview PNG path (default: <run_dir>/metrics.png)")
    args = parser.parse_args(argv)
    try:
        out = render_plots(args.run_dir, args.out)
        written = write_run_plots(args.run_dir)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in (out, *written):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
