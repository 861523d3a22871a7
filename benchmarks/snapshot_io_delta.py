"""``snapshot_io.py --delta``: what delta weight sync (``weights/delta.py``) moves and costs on a
model stepped by the real torch engine in bf16 (fp32 masters, bf16 working weights: the bytes a
snapshot carries) at RL learning rates.

Per learning rate: a fresh engine from one random Qwen-shaped model folder, ``--steps`` GRPO
updates on random token batches (the update's size is the learning rate's, not the batch's:
AdamW normalises it), and after each the exported bf16 weights go through

- ``identity``: one rank, encoded against the previous version, packed into the wire form,
  unpacked, applied and checked (the refresh's checksum per tensor, xxh3_64);
- ``tp2_to_tp1``: the same weights cut into two TP ranks (``hf_dense_rules``), one link per rank,
  then merged for a TP1 GU with the real merge code;

and through the wired transports, ``weight_delta`` on against off, export call to what the GU
offers its actors (checked bit for bit there): ``shared_fs_wired``, ``object_store_wired``,
``collective_wired`` and, with ``--two-node``, ``object_store_two_node``
(``snapshot_io_delta_wired.py``).
``memory`` is the codec alone over an in-memory medium (one copy of the packed bytes): the floor
of any medium.

Also per version: the changed fraction (elements whose bits changed), sparse bytes / full bytes,
and the alternative encoding measured on the same words: xor with the base, compressed with zlib
level 1 (no zstd / lz4 in this environment), its bytes and seconds.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/snapshot_io.py --delta --layers 4 --json runs/delta.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.snapshot_io_delta_wired import (
    collective_case,
    object_store_case,
    object_store_two_node_case,
    tp_ranks,
    wired_case,
)
from mindspeed_rl.weights.delta import DeltaEncoder, DeltaLink, DeltaReceiver, DeltaRefresh, words
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.layout import TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.merge import Piece, merge_pieces


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--delta")
    g.add_argument("--delta", action="store_true", help="measure delta weight sync instead (this module)")
    g.add_argument("--layers", type=int, default=24, help="--delta: decoder layers of the model")
    g.add_argument("--delta-hidden", type=int, default=1024, help="--delta: hidden size")
    g.add_argument("--ffn", type=int, default=4096, help="--delta: MLP width")
    g.add_argument("--lrs", default="1e-6,1e-5", help="--delta: learning rates, comma separated")
    g.add_argument("--steps", type=int, default=3, help="--delta: updates (refreshes) per learning rate")
    g.add_argument(
        "--two-node",
        action="store_true",
        help="--delta: also object_store with the GU on a second node of a Ray test cluster",
    )
    g.add_argument(
        "--warm-refreshes",
        type=int,
        default=0,
        help="--delta: refreshes of each wired case left out of its medians (shared_fs's GU writes "
        "over a retired version's file from its 4th conversion on: its steady state)",
    )


def arch(args: argparse.Namespace) -> dict[str, Any]:
    heads = args.delta_hidden // 64
    return {
        "num_layers": args.layers,
        "hidden_size": args.delta_hidden,
        "ffn_hidden_size": args.ffn,
        "num_attention_heads": heads,
        "group_query_attention": True,
        "num_query_groups": max(1, heads // 4),
        "kv_channels": 64,
        "rotary_base": 1000000.0,
        "max_position_embeddings": 512,
        "padded_vocab_size": 128,
        "untie_embeddings_and_output_weights": True,
        "norm_epsilon": 1e-6,
    }


def engine_for(path: Path, lr: float) -> Any:
    from mindspeed_rl.models.loss import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    config = TorchEngineConfig(
        lr=lr,
        clip_grad=1.0,
        micro_batch_size=4,
        forward_micro_batch_size=4,
        mini_batch_size=1,
        n_samples_per_prompt=2,
        loss=GRPOLossConfig(init_kl_coef=0.0),
        param_dtype="bfloat16",
        seed=3,
    )
    return TorchTrainingEngine(path, config)


def update(engine: Any, seed: int) -> None:
    from mindspeed_rl.models.training.batch import TrainBatch

    rng = np.random.default_rng(seed)
    prompts, responses = [], []
    for _ in range(2):
        prompt = rng.integers(4, 100, size=8).tolist()
        for _ in range(2):
            prompts.append(prompt)
            responses.append(rng.integers(4, 100, size=16).tolist())
    batch = TrainBatch.from_lists(prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=4))
    engine.update(batch.with_log_probs(old=engine.compute_log_probs(batch, 1.0)), 1.0)


def snapshot(engine: Any) -> dict[str, torch.Tensor]:
    """The exported weights, copied: in bf16 the engine hands out its live working parameters
    (no dtype change, no copy), which the next update would change under us."""
    return {name: t.clone() for name, t in engine.named_weights_for_inference()}


def memory_medium(buffer: bytes) -> bytes:
    return bytes(bytearray(buffer))


def xor_zlib(old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> tuple[int, float]:
    tic = time.perf_counter()
    nbytes = sum(len(zlib.compress(np.bitwise_xor(old[k], new[k]).tobytes(), 1)) for k in new)
    return nbytes, time.perf_counter() - tic


def refresh_case(
    layout: TrainingLayout,
    versions: list[dict[str, torch.Tensor]],
    carry: Callable[[bytes], bytes],
) -> dict[str, list[float]]:
    """Per version after the first: seconds of the delta refresh and of the full one, end to end
    (encode, pack, medium, unpack, apply + check, merge when TP2), and the bytes each moved."""
    delta_links = [
        DeltaLink(DeltaEncoder("on", full_interval=10**6), DeltaReceiver()) for _ in range(layout.world_size)
    ]
    full_links = [DeltaLink(DeltaEncoder("off"), DeltaReceiver()) for _ in range(layout.world_size)]
    sizes: list[int] = []

    def wire(refresh: DeltaRefresh) -> DeltaRefresh:
        buffer = pack(refresh)
        sizes.append(len(buffer))
        return unpack(carry(buffer))

    out: dict[str, list[float]] = {"delta_s": [], "full_s": [], "delta_bytes": [], "full_bytes": []}
    for i, full in enumerate(versions):
        shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
        for kind, links in (("delta", delta_links), ("full", full_links)):
            sizes.clear()
            tic = time.perf_counter()
            for rank, link in enumerate(links):
                link.refresh(i + 1, shards[rank], wire)
            if layout.world_size > 1:
                pieces = [
                    Piece(name=n, tensor=t, spec=layout.spec_for(n), coords=layout.coords(r))
                    for r, link in enumerate(links)
                    for n, t in link.receiver.tensors().items()
                ]
                merged = merge_pieces(pieces, tp_size=layout.tp_size, ep_size=1)
            else:
                merged = links[0].receiver.tensors()
            seconds = time.perf_counter() - tic
            if i > 0:
                out[f"{kind}_s"].append(seconds)
                out[f"{kind}_bytes"].append(float(sum(sizes)))
            for name, t in full.items():  # exact: the GU holds the trainer's bits
                assert torch.equal(merged[name].view(torch.uint8), t.view(torch.uint8)), (i, name)
    return out


def _local_ray() -> None:
    """The object_store and collective cases' Ray: local, no dashboard (their puts go to this
    host's shared memory)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)


def codec_steps(engine: Any, lr: float, steps: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    """``steps`` updates of ``engine``: the exported weights before and after each, and per update
    the changed fraction, the sparse codec's bytes and seconds, and xor + zlib's on the same words."""
    versions = [snapshot(engine)]
    params = sum(t.numel() for t in versions[0].values())
    figures: dict[str, Any] = {key: [] for key in CODEC_KEYS}
    for step in range(steps):
        tic = time.perf_counter()
        update(engine, step)
        print(f"lr={lr:g} step {step + 1}: update {time.perf_counter() - tic:.1f}s", flush=True)
        versions.append(snapshot(engine))
        old = {k: words(v) for k, v in versions[-2].items()}
        new = {k: words(v) for k, v in versions[-1].items()}
        link = DeltaLink(DeltaEncoder("on"), DeltaReceiver())
        link.refresh(0, versions[-2], lambda r: r)
        m = link.refresh(1, versions[-1], lambda r: r)
        full_bytes = sum(w.nbytes for w in new.values())
        xor_bytes, xor_seconds = xor_zlib(old, new)
        for key, value in zip(
            CODEC_KEYS,
            (
                sum(int((old[k] != new[k]).sum()) for k in new) / params,
                m["delta_bytes_sent"] / full_bytes,
                m["delta_encode_seconds"],
                m["delta_apply_seconds"],
                xor_bytes / full_bytes,
                xor_seconds,
            ),
            strict=True,
        ):
            figures[key].append(value)
    figures["full_bytes"] = float(sum(t.numel() * t.element_size() for t in versions[0].values()))
    return versions, figures


CODEC_KEYS = (
    "changed_fraction",
    "sparse_bytes_fraction",
    "sparse_encode_s",
    "sparse_apply_s",
    "xor_zlib1_bytes_fraction",
    "xor_zlib1_encode_s",
)


def transport_cases(
    args: argparse.Namespace, versions: list[dict[str, torch.Tensor]], tmp: Path
) -> dict[str, Any]:
    """Every layout through every wired transport and the codec over memory."""
    import ray

    warm = args.warm_refreshes
    out: dict[str, Any] = {}
    for name, layout in (
        ("identity", TrainingLayout()),
        ("tp2_to_tp1", TrainingLayout(tp_size=2, rules=hf_dense_rules())),
    ):
        out[f"{name}/shared_fs_wired"] = wired_case(layout, versions, tmp, warm)
        out[f"{name}/object_store_wired"] = object_store_case(layout, versions, warm)
        out[f"{name}/collective_wired"] = collective_case(layout, versions, args.bucket_mb, warm)
        if args.two_node:
            ray.shutdown()  # the local instance makes way for a two-node test cluster
            out[f"{name}/object_store_two_node"] = object_store_two_node_case(layout, versions, warm)
            _local_ray()
        r = refresh_case(layout, versions, memory_medium)
        out[f"{name}/memory"] = {
            "delta_s": statistics.median(r["delta_s"]),
            "full_s": statistics.median(r["full_s"]),
            "seconds_ratio": statistics.median(d / f for d, f in zip(r["delta_s"], r["full_s"], strict=True)),
            "bytes_ratio": statistics.median(
                d / f for d, f in zip(r["delta_bytes"], r["full_bytes"], strict=True)
            ),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from mindspeed_rl.models.tiny import create_tiny_model

    results: dict[str, Any] = {
        "arch": arch(args),
        "steps": args.steps,
        "warm_refreshes": args.warm_refreshes,
        "cases": {},
    }
    _local_ray()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = create_tiny_model(Path(tmp) / "model", arch(args), seed=0)
        for lr in [float(x) for x in args.lrs.split(",")]:
            versions, case = codec_steps(engine_for(model_path, lr), lr, args.steps)
            results["params"] = sum(t.numel() for t in versions[0].values())
            results["dtype"] = str(next(iter(versions[0].values())).dtype)
            case.update(transport_cases(args, versions, Path(tmp)))
            results["cases"][f"lr={lr:g}"] = case
            print(json.dumps({f"lr={lr:g}": case}, indent=1), flush=True)
    ray.shutdown()
    print_table(results)
    return results


def print_table(results: dict[str, Any]) -> None:
    """One line per learning rate, layout and transport: what the docs table shows."""
    print(
        f"{results['params'] / 1e6:.0f} M parameters ({results['dtype']}), medians over the refreshes"
        f" (wired cases: after the first {results.get('warm_refreshes', 0)})"
    )
    print("lr     changed  layout      transport              bytes(delta/full)  refresh s (delta vs full)")
    for lr, case in results["cases"].items():
        changed = statistics.median(case["changed_fraction"])
        for key, row in case.items():
            if "/" not in key:
                continue
            layout, transport = key.split("/")
            print(
                f"{lr[3:]:6s} {changed:7.2%}  {layout:10s}  {transport:21s}  {row['bytes_ratio']:.3f}x"
                f"             {row['seconds_ratio']:.2f}x ({row['delta_s']:.2f} vs {row['full_s']:.2f})"
            )
