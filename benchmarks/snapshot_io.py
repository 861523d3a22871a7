"""Weight-flow speed and host memory on this machine: export copy, save (T_save), convert
(T_convert), reload (T_load).

Builds a random Qwen-shaped fp32 model of about ``--mb`` megabytes (HF names; ``--hidden`` and
``--vocab`` set its largest tensors) and, per repeat, in fresh folders, runs the whole flow for
the cases of ``--cases``:

- ``tp1``: a single-rank export converted for a tp=1 GU (identity: the GU links the file);
- ``tp2_to_tp1``: a TP=2 export (two writers, as two rank processes would) merged for a tp=1 GU.

The reload is timed twice, as each kind of actor does it: ``reload`` as a TP > 1 actor (its
vLLM workers read the folder themselves: the actor verifies the file streaming and keeps
nothing, ``ReloadPolicy.maybe_reload_from_folder``), ``reload_tensors`` as a TP1 actor (reads
and verifies the tensors into host memory for its in-process engine). Run against a library
without the streaming verification, ``reload`` falls back to what TP > 1 actors did then (read
into memory) and ``reload_mode`` says so.

End to end = export copy + save + convert + reload of the same bytes, as GB/s of model bytes
(``end_to_end_tensors_gb_per_s``: with the TP1 actor's reload instead). Beside it, in the same
repeat, the raw copy speed of the same bytes: the export's shard files copied with
``shutil.copyfile`` into a fresh folder and fsynced (the save fsyncs too), right after the flow.
All of these are timed in this process, as they were before memory was measured, so they
compare with earlier runs.

Peak memory, measured in a child process: after the timed flow, convert, reload and
reload_tensors each run again alone in a fresh spawned process; ``*_peak_rss_gb`` is that
child's peak resident set during the step (the kernel's VmHWM, reset just before the step)
minus its resident set right before the step: what the step itself adds, the page cache
excluded. ``largest_tensor_gb`` is the model's largest tensor.

Every number is the median over ``--repeats``; the ratio is the median of the per-repeat ratios::

    .venv/bin/python benchmarks/snapshot_io.py --mb 1024 --json runs/snapshot_io.json
    .venv/bin/python benchmarks/snapshot_io.py --transport object_store --mb 1024 --json runs/snapshot_io_os.json
    .venv/bin/python benchmarks/snapshot_io.py --mb 4096 --hidden 1024 --vocab 32768 --cases tp2_to_tp1
    .venv/bin/python benchmarks/snapshot_io.py --delta --json runs/snapshot_io_delta.json  # snapshot_io_delta.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
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
    p.add_argument(
        "--hidden", type=int, default=256, help="hidden size (layer tensors are hidden x hidden ... 3 hidden)"
    )
    p.add_argument(
        "--vocab", type=int, default=2048, help="vocabulary (embedding and lm_head: vocab x hidden)"
    )
    p.add_argument("--cases", default="tp1,tp2_to_tp1", help="comma-separated: tp1, tp2_to_tp1")
    p.add_argument(
        "--transport",
        default="shared_fs",
        choices=("shared_fs", "object_store", "collective"),
        help="the weight medium (async_config.weight_transport); in-memory ones: snapshot_io_memory.py",
    )
    p.add_argument("--bucket-mb", type=float, default=512.0, help="collective: MB per send bucket")
    p.add_argument(
        "--warm-versions",
        type=int,
        default=1,
        help="in-memory transports: untimed versions exported and reloaded before the timed one "
        "(3 = the steady state of a run: the timed version reuses store memory and buckets a "
        "freed version used)",
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo root
    from benchmarks.snapshot_io_delta import add_args

    add_args(p)
    return p.parse_args()


def build_model(target_mb: float, hidden: int = 256, vocab: int = 2048) -> dict[str, torch.Tensor]:
    """Layers of q/k/v/o + SwiGLU MLP (ffn = 3 x hidden) until the byte budget is reached."""
    gen = torch.Generator().manual_seed(0)
    ffn = 3 * hidden
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
    convert = _convert_step(published, root / "gu", threads)
    converted = SnapshotInfo(version=published.version, path=Path(convert["converted"]))
    # The TP1 reload first, where the flow's only reload ran before streaming existed: it is the
    # first step to allocate a model's worth of memory. Timed after the streaming reload (which
    # allocates none) it paid the kernel's page-cache reclaim for that memory: 4.7 s, not 1.4 s,
    # on the 4 GB case here.
    tensors = _reload_tensors_step(converted, threads)
    reload = _reload_step(converted, threads)
    stages |= {"convert_s": convert["seconds"], "reload_s": reload["seconds"]}
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    end_to_end = sum(stages.values())
    end_to_end_tensors = end_to_end - reload["seconds"] + tensors["seconds"]
    raw = raw_copy_seconds(published, root / "raw-copy")
    # The same steps again, each alone in a child process, for their memory (after the timed flow,
    # so the children's reads do not warm the page cache for it).
    memory = {
        "convert_peak_rss_gb": in_child(_convert_step, published, root / "gu-rss", threads),
        "reload_peak_rss_gb": in_child(_reload_step, converted, threads),
        "reload_tensors_peak_rss_gb": in_child(_reload_tensors_step, converted, threads),
    }
    return (
        stages
        | {
            "convert_method": convert["method"],
            "reload_mode": reload["mode"],
            "end_to_end_s": end_to_end,
            "raw_copy_s": raw,
            "end_to_end_gb_per_s": nbytes / 1e9 / end_to_end,
            "raw_copy_gb_per_s": nbytes / 1e9 / raw,
            "reload_tensors_s": tensors["seconds"],
            "end_to_end_tensors_gb_per_s": nbytes / 1e9 / end_to_end_tensors,
        }
        | {key: step["peak_rss_growth"] / 1e9 for key, step in memory.items()}
    )


def _convert_step(published: SnapshotInfo, cache: Path, threads: int | None) -> dict[str, Any]:
    result = GuConverter(cache, InferenceLayout(), num_threads=threads).convert(published)
    return {"seconds": result.total_seconds, "method": result.method, "converted": str(result.converted.path)}


def _reload_step(converted: SnapshotInfo, threads: int | None) -> dict[str, Any]:
    policy = ReloadPolicy(-1, num_threads=threads)
    if hasattr(policy, "maybe_reload_from_folder"):
        reload, mode = policy.maybe_reload_from_folder(converted, lambda path: None), "verify_streaming"
    else:  # a library from before streaming verification: TP > 1 actors read the file into memory
        reload, mode = policy.maybe_reload(converted, lambda named: None), "read_into_memory"
    assert reload.status == "loaded", reload.reason
    return {"seconds": reload.load_seconds, "mode": mode}


def _reload_tensors_step(converted: SnapshotInfo, threads: int | None) -> dict[str, Any]:
    reload = ReloadPolicy(-1, num_threads=threads).maybe_reload(converted, lambda named: None)
    assert reload.status == "loaded", reload.reason
    return {"seconds": reload.load_seconds}


def in_child(step: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``step(*args)`` in a fresh spawned process; its result plus ``peak_rss_growth`` (bytes):
    the step's peak resident set over the resident set right before it (see the module docstring)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(child, step, args))
    process.start()
    child.close()
    try:
        ok, payload = parent.recv()
    except EOFError:
        ok, payload = False, "the child process died without a result"
    process.join()
    if not ok:
        raise RuntimeError(f"{step.__name__} failed in its child process: {payload}")
    return payload


def _child_main(conn: Any, step: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        before = _status_kb("VmRSS") * 1024
        resettable = _reset_peak_rss()
        result = step(*args)
        peak = _status_kb("VmHWM") * 1024 if resettable else _max_rss_bytes()
        conn.send((True, result | {"peak_rss_growth": max(0, peak - before)}))
    except BaseException as err:
        conn.send((False, repr(err)))
    finally:
        conn.close()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}; peak RSS needs Linux")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _max_rss_bytes() -> int:
    """Peak RSS since the process started (a coarser fallback: it includes the imports)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_flow(
    transport: str,
    case: str,
    model: dict[str, torch.Tensor],
    run: int,
    bucket_mb: float,
    warm_versions: int = 1,
) -> dict[str, Any]:
    """One repeat of an in-memory transport, with the same per-case keys as ``one_flow``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo root
    from benchmarks.snapshot_io_memory import collective_flow, object_store_flow

    if transport == "object_store":
        stages = object_store_flow(case, model, run, warm_versions)
    else:
        stages = collective_flow(case, model, run, bucket_mb, warm_versions)
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    end_to_end = sum(stages[k] for k in ("export_copy_s", "save_s", "convert_s", "reload_s"))
    out = stages | {
        "end_to_end_s": end_to_end,
        "end_to_end_gb_per_s": nbytes / 1e9 / end_to_end,
        "raw_copy_gb_per_s": nbytes / 1e9 / stages["raw_copy_s"],
    }
    if "raw_warm_copy_s" in stages:
        out["raw_warm_copy_gb_per_s"] = nbytes / 1e9 / stages["raw_warm_copy_s"]
    return out


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
    if "raw_warm_copy_gb_per_s" in runs[0]:
        warm = [r["end_to_end_gb_per_s"] / r["raw_warm_copy_gb_per_s"] for r in runs]
        out["ratio_end_to_end_to_raw_warm_copy"] = statistics.median(warm)
    if "end_to_end_tensors_gb_per_s" in runs[0]:
        out["repeats_end_to_end_tensors_gb_per_s"] = [
            round(r["end_to_end_tensors_gb_per_s"], 3) for r in runs
        ]
    for key in (
        "convert_peak_rss_gb",
        "reload_peak_rss_gb",
        "reload_tensors_peak_rss_gb",
        "receive_peak_rss_gb",
    ):
        if key in runs[0]:
            out[f"repeats_{key}"] = [round(r[key], 4) for r in runs]
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
    if args.delta:  # delta weight sync on a model the torch engine steps (snapshot_io_delta.py)
        from benchmarks.snapshot_io_delta import run as run_delta

        delta = run_delta(args)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(delta, indent=1))
        return
    threads = args.threads or None
    model = build_model(args.mb, hidden=args.hidden, vocab=args.vocab)
    import mindspeed_rl

    report: dict[str, Any] = {
        "library": str(Path(mindspeed_rl.__file__).parent),
        "model_mb": sum(t.numel() * 4 for t in model.values()) / 1e6,
        "largest_tensor_gb": max(t.numel() * t.element_size() for t in model.values()) / 1e9,
        "num_tensors": len(model),
        "io_threads": args.threads or "default",
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_start": os.getloadavg()[0],
        "crc32_mb_per_s": crc32_mb_per_s(model),
        "timings": "in this process",
        "peak_rss": "child process per step: VmHWM reset before the step, minus VmRSS before it",
    }
    report["transport"] = args.transport
    if args.transport != "shared_fs":
        import ray

        # Room for a few model copies (the flow's, the raw copy's) in the store's shared memory.
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 object_store_memory=int(max(4 * report["model_mb"] * 1e6, 2e9)))  # fmt: skip
        report["timings"] = "stages self-timed; reload in a Ray task (another process, as an actor)"
        report["peak_rss"] = "in the process of the step: VmHWM reset before it, minus VmRSS before it"
    for case in args.cases.split(","):
        runs = []
        for run in range(args.repeats):
            if args.transport != "shared_fs":
                runs.append(memory_flow(args.transport, case, model, run, args.bucket_mb, args.warm_versions))
                continue
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
