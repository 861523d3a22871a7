"""Table 4b by trace replay on the AIME length trace (DeepSeek-R1-Distill-Qwen-1.5B, real lengths).

    python benchmarks/replay_table4b.py [--scale 0.01] [--iters 6] [--backend vllm] [--json out.json] \
        [--sim-fit-from C2|all] [replay_trace.py flags and config overrides]

Wraps ``cli/replay_trace.py``: C0–C4 at tau 0.6 on the real async pipeline with forced lengths and
a simulated trainer step, then (``--sim-fit-from``, default ``all``; ``none`` skips it) calibrates
the simulator from the replayed runs and simulates the same settings (``cli/sim_vs_replay.py``).
The trace is read from ``../shared/data/eval`` when it is there; pass ``--trace`` otherwise.
Prints the measured tables; nothing here is tuned to a target.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import replay_trace, sim_vs_replay

AIME = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval" / "aime_r1distill_1p5b_lengths.jsonl"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--trace" not in args:
        if not AIME.is_file():
            print(f"no trace at {AIME}; pass --trace FILE (JSONL with prompt_id, response_tokens)")
            return 2
        args = ["--trace", str(AIME), *args]
    fit_from = "all"
    if "--sim-fit-from" in args:
        at = args.index("--sim-fit-from")
        fit_from = args[at + 1]
        del args[at : at + 2]
    defaults = {
        "--tau": "0.6",
        "--scale": "0.01",
        "--run-dir": "runs/replay_table4b",
        "--json": "runs/replay_table4b.json",
    }
    for flag, value in defaults.items():
        if flag not in args:
            args += [flag, value]
    code = replay_trace.main(args)
    if code != 0 or fit_from == "none":
        return code
    report = args[args.index("--json") + 1]
    comparison = str(Path(report).with_suffix("")) + "_sim.json"
    return sim_vs_replay.main(["--report", report, "--fit-from", fit_from, "--json", comparison])


if __name__ == "__main__":
    sys.exit(main())
