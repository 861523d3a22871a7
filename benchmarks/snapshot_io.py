"""Weight-flow timings on this machine: export (T_save), convert (T_convert), reload (T_load).

Builds a random Qwen-shaped fp32 model of about ``--mb`` megabytes (HF names), exports it
single-rank and as a fake TP=2 export, converts both for a tp=1 GU, and reloads with 1 and
with ``--threads`` reader threads. Each timing is the median of ``--repeats`` runs::

    .venv/bin/python benchmarks/snapshot_io.py --json runs/snapshot_io.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mindspeed_rl.workers.resharding.convert import GuConverter
from mindspeed_rl.workers.resharding.export import SnapshotWriter
from mindspeed_rl.workers.resharding.layout import InferenceLayout, TrainingLayout, hf_dense_rules
from mindspeed_rl.workers.resharding.manifest import SnapshotInfo
from mindspeed_rl.workers.resharding.reload import ReloadPolicy
from mindspeed_rl.workers.resharding.store import latest_published


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here (also printed)")
    p.add_argument("--mb", type=float, default=32.0, help="approximate model size in MB")
    p.add_argument("--threads", type=int, default=4, help="reader threads for the parallel loader")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
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


def median_seconds(fn: Callable[[int], float], repeats: int) -> float:
    return statistics.median(fn(i) for i in range(repeats))


def tp_shard(layout: TrainingLayout, model: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in model.items():
        spec = layout.spec_for(name)
        out[name] = tensor.chunk(layout.tp_size, spec.tp_dim)[rank] if spec.tp_dim is not None else tensor
    return out


def bench_export(root: Path, model: dict[str, torch.Tensor], repeats: int) -> dict[str, Any]:
    writer = SnapshotWriter(root, keep_last=repeats + 1)
    results = [writer.export(v, model.items(), TrainingLayout()).result() for v in range(repeats)]
    writer.close()
    return {
        "save_seconds": statistics.median(r.save_seconds for r in results),
        "prepare_seconds_blocking_trainer": statistics.median(r.prepare_seconds for r in results),
        "bytes": results[0].bytes_written,
    }


def bench_convert(root: Path, model: dict[str, torch.Tensor], repeats: int) -> dict[str, Any]:
    layout = TrainingLayout(tp_size=2, rules=hf_dense_rules())
    writer = SnapshotWriter(root / "tp2", keep_last=1)
    for rank in range(2):
        writer.export(0, tp_shard(layout, model, rank).items(), layout, rank=rank)
    writer.close()
    single = SnapshotWriter(root / "tp1", keep_last=1)
    info_tp1 = single.export(0, model.items(), TrainingLayout()).result().published
    single.close()
    info_tp2 = next((root / "tp2").glob("v0"))
    assert info_tp1 is not None

    def run(source_dir: Path, i: int) -> float:
        converter = GuConverter(root / f"cache-{source_dir.parent.name}-{i}", InferenceLayout())
        return converter.convert(SnapshotInfo(version=0, path=source_dir)).total_seconds

    return {
        "convert_identity_seconds": median_seconds(lambda i: run(info_tp1.path, i), repeats),
        "convert_tp2_to_tp1_seconds": median_seconds(lambda i: run(info_tp2, i), repeats),
    }


def bench_reload(root: Path, threads: int, repeats: int) -> dict[str, Any]:
    info = latest_published(root / "tp1")
    assert info is not None

    def run(num_threads: int) -> float:
        result = ReloadPolicy(-1, num_threads=num_threads).maybe_reload(info, lambda named: None)
        assert result.status == "loaded", result.reason
        return result.load_seconds

    return {
        "load_seconds_1_thread": median_seconds(lambda _: run(1), repeats),
        f"load_seconds_{threads}_threads": median_seconds(lambda _: run(threads), repeats),
    }


def crc32_mb_per_s(model: dict[str, torch.Tensor]) -> float:
    started = time.perf_counter()
    for tensor in model.values():
        zlib.crc32(tensor.view(torch.uint8).numpy().data)
    return sum(t.numel() * 4 for t in model.values()) / 1e6 / (time.perf_counter() - started)


def main() -> None:
    args = parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model = build_model(args.mb)
    with tempfile.TemporaryDirectory(prefix="snapshot_io_") as tmp:
        root = Path(tmp)
        report: dict[str, Any] = {
            "model_mb": sum(t.numel() * 4 for t in model.values()) / 1e6,
            "num_tensors": len(model),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_1min_at_start": os.getloadavg()[0],
            "crc32_mb_per_s": crc32_mb_per_s(model),
        }
        report |= bench_export(root / "export", model, args.repeats)
        report |= bench_convert(root, model, args.repeats)
        report |= bench_reload(root, args.threads, args.repeats)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
