"""Host memory of the GU's merge and of a TP > 1 actor's reload scales with one tensor, not the model.

Each step runs in a fresh child process (``benchmarks.snapshot_io.in_child``: the kernel's peak
RSS mark reset before the step, minus the RSS before it), on a ~100 MB model whose largest tensor
is 8 MB, with one I/O thread as the GU and the actors run. A whole-model read in the same harness
is the contrast that shows the measurement sees a model's worth of memory when one is held.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.snapshot_io import (
    _convert_step,
    _reload_step,
    _reload_tensors_step,
    build_model,
    export_tp2,
    in_child,
)
from mindspeed_rl.weights.manifest import SnapshotInfo

pytestmark = pytest.mark.slow
MB = 1_000_000
OVERHEAD = 16 * MB  # an 8 MiB read buffer, allocator slack


def test_merge_and_streaming_reload_hold_about_one_tensor(tmp_path: Path) -> None:
    model = build_model(96, hidden=512, vocab=4096)
    largest = max(t.numel() * t.element_size() for t in model.values())
    total = sum(t.numel() * t.element_size() for t in model.values())
    assert largest * 10 < total
    _, published = export_tp2(tmp_path / "export", model, 1)
    del model

    convert = in_child(_convert_step, published, tmp_path / "gu", 1)
    assert convert["method"] == "merged"
    converted = SnapshotInfo(version=published.version, path=Path(convert["converted"]))
    reload = in_child(_reload_step, converted, 1)
    assert reload["mode"] == "verify_streaming"
    whole = in_child(_reload_tensors_step, converted, 1)

    assert convert["peak_rss_growth"] <= 2 * largest + OVERHEAD, convert
    assert reload["peak_rss_growth"] <= 1.5 * largest + OVERHEAD, reload
    assert whole["peak_rss_growth"] >= 0.9 * total, whole
