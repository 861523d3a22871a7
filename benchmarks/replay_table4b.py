"""Table 4b by trace replay on the AIME length trace (DeepSeek-R1-Distill-Qwen-1.5B, real lengths).

    python benchmarks/replay_table4b.py [--scale 0.01] [--iters 6] [--backend vllm] [--json out.json]

Wraps ``cli/replay_trace.py``: C0–C4 at tau 0.6 on the real async pipeline with forced lengths and
a simulated trainer step. The trace is read from ``../shared/data/eval`` when it is there; pass
``--trace`` otherwise. Prints the measured table; nothing here is tuned to a target.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import replay_trace

AIME = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval" / "aime_r1distill_1p5b_lengths.jsonl"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--trace" not in args:
        if not AIME.is_file():
            print(f"no trace at {AIME}; pass --trace FILE (JSONL with prompt_id, response_tokens)")
            return 2
        args = ["--trace", str(AIME), *args]
    defaults = {"--tau": "0.6", "--scale": "0.01", "--run-dir": "runs/replay_table4b"}
    for flag, value in defaults.items():
        if flag not in args:
            args += [flag, value]
    return replay_trace.main(args)


if __name__ == "__main__":
    sys.exit(main())
