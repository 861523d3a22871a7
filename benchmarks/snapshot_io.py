"""Weight-flow speed on this machine: export copy, save (T_save), convert (T_convert), reload (T_load).

Builds a random Qwen-shaped fp32 model of about ``--mb`` megabytes (HF names) and, per repeat,
in fresh folders, runs the whole flow for two cases:

- ``tp1``: a single-rank export converted for a tp=1 GU (identity: the GU links the file);
- ``tp2_to_tp1``: a TP=2 export (two writers, as two rank processes would) merged for a tp=1 GU.

End to end = export copy + save + convert + reload of the same bytes, as GB/s of model bytes.
Beside it, in the same repeat, the raw copy speed of the same bytes: the export's shard files
copied with ``shutil.copyfile`` into a fresh folder and fsynced (the save fsyncs too), right
after the flow. Every number is the median over ``--repeats``; the ratio is the median of the
per-repeat ratios::

    .venv/bin/python benchmarks/snapshot_io.py --mb 1024 --json runs/snapshot_io.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.weights.convert import GuConverter
from mindspeed_rl.weights.export import ExportResult, SnapshotWriter
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.manifest import SnapshotInfo
from mindspeed_rl.weights.reload import ReloadPolicy
from mindspeed_rl.weights.store import fsync_path

TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    p.add_argument("--mb", type=float, default=32.0, help="approximate model size in MB")
    p.add_argument("--threads", type=int, default=0, help="I/O threads per shard (0: the library default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    p.add_argument("--dir", type=Path, default=None, help="scratch folder (default: the system temp dir)")
    return p.parse_args()


def build_model(target_mb: float, hidden: int = 256) -> dict[str, torch.Tensor]:
    """Layers of q/k/v/o + SwiGLU MLP (ffn = 3 x hidden) until the byte budget is reached."""
    gen = torch.Generator().manual_seed(0)
    vocab, ffn = 2048, 3 * hidden
    model = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
        "lm_head.weight": torch.randn(vocab, hidden, generator=gen),
        "model.norm.weight": torch.ones(hidden),
    }
    layer = 0
    while sum(t.numel() * 4 for t in model.values()) < target_mb * 1e6:
        p = f"model.layers.{layer}."
        for proj in ("q", "k", "v", "o"):
            model[p + f"self_attn.{proj}_proj.weight"] = torch.randn(hidden, hidden, generator=gen)
        model[p + "mlp.gate_proj.weight"] = torch.randn(ffn, hidden, generator=gen)
        model[p + "mlp.up_proj.weight"] = torch.randn(ffn, hidden, generator=gen)
        model[p + "mlp.down_proj.weight"] = torch.randn(hidden, ffn, generator=gen)
        model[p + "input_layernorm.weight"] = torch.ones(hidden)
        layer += 1
    return model


def tp_shard(layout: TrainingLayout, model: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in model.items():
        spec = layout.spec_for(name)
        out[name] = tensor.chunk(layout.tp_size, spec.tp_dim)[rank] if spec.tp_dim is not None else tensor
    return out


def export_tp1(root: Path, model: dict[str, torch.Tensor], threads: int | None) -> tuple[dict, SnapshotInfo]:
    writer = SnapshotWriter(root, keep_last=1, num_threads=threads, run_id="bench")
    result = writer.export(0, model.items(), TrainingLayout()).result()
    writer.close()
    assert result.published is not None
    return {"export_copy_s": result.prepare_seconds, "save_s": result.write_seconds}, result.published


def export_tp2(root: Path, model: dict[str, torch.Tensor], threads: int | None) -> tuple[dict, SnapshotInfo]:
    """Two writers, one per rank, as two TU rank processes: their writes overlap."""
    writers = [SnapshotWriter(root, keep_last=1, num_threads=threads, run_id="bench") for _ in range(2)]
    shards = [tp_shard(TP2, model, rank) for rank in range(2)]
    futures = [w.export(0, shards[r].items(), TP2, rank=r) for r, w in enumerate(writers)]
    results: list[ExportResult] = [f.result() for f in futures]
    for w in writers:
        w.close()
    published = next(r.published for r in results if r.published is not None)
    # Rank processes copy and write side by side: the flow waits for the slower of each.
    stages = {
        "export_copy_s": max(r.prepare_seconds for r in results),
        "save_s": max(r.write_seconds for r in results),
    }
    return stages, published


def raw_copy_seconds(source: SnapshotInfo, target: Path) -> float:
    target.mkdir()
    started = time.perf_counter()
    for path in sorted(source.path.glob("*.safetensors")):
        shutil.copyfile(path, target / path.name)
        fsync_path(target / path.name)
    return time.perf_counter() - started


def one_flow(root: Path, case: str, model: dict[str, torch.Tensor], threads: int | None) -> dict[str, Any]:
    export = export_tp1 if case == "tp1" else export_tp2
    stages, published = export(root / "export", model, threads)
    convert = GuConverter(root / "gu", InferenceLayout(), num_threads=threads).convert(published)
    policy = ReloadPolicy(-1, num_threads=threads)
    reload = policy.maybe_reload(convert.converted, lambda named: None)
    assert reload.status == "loaded", reload.reason
    stages |= {"convert_s": convert.total_seconds, "reload_s": reload.load_seconds}
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    end_to_end = sum(stages.values())
    raw = raw_copy_seconds(published, root / "raw-copy")
    return stages | {
        "convert_method": convert.method,
        "end_to_end_s": end_to_end,
        "raw_copy_s": raw,
        "end_to_end_gb_per_s": nbytes / 1e9 / end_to_end,
        "raw_copy_gb_per_s": nbytes / 1e9 / raw,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        out[key] = statistics.median(r[key] for r in runs) if isinstance(value, float) else value
    # The host is shared: a repeat's flow and its raw copy see the same load, so the ratio is
    # taken per repeat (then the median), not from the two medians.
    ratios = [r["end_to_end_gb_per_s"] / r["raw_copy_gb_per_s"] for r in runs]
    out["ratio_end_to_end_to_raw_copy"] = statistics.median(ratios)
    out["repeats_ratio"] = [round(x, 3) for x in ratios]
    out["repeats_end_to_end_gb_per_s"] = [round(r["end_to_end_gb_per_s"], 3) for r in runs]
    out["repeats_raw_copy_gb_per_s"] = [round(r["raw_copy_gb_per_s"], 3) for r in runs]
    return out


def crc32_mb_per_s(model: dict[str, torch.Tensor]) -> float:
    started = time.perf_counter()
    for tensor in model.values():
        zlib.crc32(tensor.view(torch.uint8).numpy().data)
    return sum(t.numel() * 4 for t in model.values()) / 1e6 / (time.perf_counter() - started)


def main() -> None:
    args = parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    threads = args.threads or None
    model = build_model(args.mb)
    report: dict[str, Any] = {
        "model_mb": sum(t.numel() * 4 for t in model.values()) / 1e6,
        "num_tensors": len(model),
        "io_threads": args.threads or "default",
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_start": os.getloadavg()[0],
        "crc32_mb_per_s": crc32_mb_per_s(model),
    }
    for case in ("tp1", "tp2_to_tp1"):
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="snapshot_io_", dir=args.dir) as tmp:
                runs.append(one_flow(Path(tmp), case, model, threads))
        report[case] = medians(runs)
    report["load_average_1min_at_end"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
