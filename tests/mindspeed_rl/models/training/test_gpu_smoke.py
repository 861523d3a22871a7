"""``benchmarks/gpu_smoke.py --dry-run``: the GPU benchmark's code path on a tiny model on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_dry_run_reports_both_engines(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_smoke", "--dry-run", "--steps", "2", "--json", str(out)],
        cwd=REPO, check=True, timeout=170,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and set(result["engines"]) == {"megatron", "torch"}
    for name, engine in result["engines"].items():
        assert engine["tokens_per_s"] > 0 and 0 < engine["mfu"] < 1, name
        assert engine["peak_memory_gb"] is None and engine["peak_over_planned"] is None  # no allocator on CPU
        # On a CPU host both engines step precision.py's fp32 AdamW (on a GPU the megatron engine
        # steps megatron's ChainedOptimizer): the JSON names which one stepped.
        assert engine["optimizer"] == "FullPrecisionOptimizer", name
        assert engine["planned_memory_gb"] > engine["planned_terms_gb"]["headroom"], name
        assert len(engine["step_seconds"]) == 2
    assert result["model"]["parameters"] == 115136  # the tiny Qwen3, tied embeddings counted once
