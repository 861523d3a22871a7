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
offers its actors (checked bit for bit there): ``shared_fs_wired`` (the real exporters and GU end:
files in a snapshot root on this host's disk), ``object_store_wired`` (a local Ray instance) and
``collective_wired`` (a gloo group, the TU ranks and the GU's receiver on threads of this process).
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


def tp_ranks(layout: TrainingLayout, full: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = []
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        mine = {}
        for name, t in full.items():
            spec = layout.spec_for(name)
            if not layout.writes(spec, coords):
                continue
            if spec.tp_dim is not None:
                t = t.chunk(layout.tp_size, dim=spec.tp_dim)[coords.tp_rank]
            mine[name] = t.contiguous()
        out.append(mine)
    return out


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


def wired_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], tmp: Path, warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: shared_fs`` path (``weights.delta_fs``), ``weight_delta`` on
    against off: per version, from the TU ranks' export call until the GU's conversion is
    published (write + publish, then apply + write the applied copy + convert for on; write +
    publish, then hard link or merge for off), and the bytes the TU put in the shared folder."""
    from safetensors.torch import load_file

    from mindspeed_rl.weights.store import snapshot_dirname
    from mindspeed_rl.weights.transports import DeltaSettings, transport_for

    shared_fs = transport_for("shared_fs")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in (("off", None), ("on", DeltaSettings(mode="on", full_interval=10**6))):
        root = Path(tempfile.mkdtemp(dir=tmp, prefix=f"wired-{kind}-"))  # one per call: a fresh run
        writers = [
            shared_fs.exporter(root / "trainer", 2, run_id="bench", delta=delta)
            for _ in range(layout.world_size)
        ]
        gu = shared_fs.gu_end(root / "gu0", delta=delta, gu_id=0)
        try:
            for i, full in enumerate(versions):
                shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
                tic = time.perf_counter()
                futures = [w.export(i + 1, shards[r].items(), layout, r) for r, w in enumerate(writers)]
                for f in futures:
                    f.result()
                folder = root / "trainer" / snapshot_dirname(i + 1)
                nbytes = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("rank-"))
                done = gu.convert(i + 1, str(folder))
                seconds = time.perf_counter() - tic
                assert done.path is not None
                got = load_file(str(Path(done.path) / "rank-00000.safetensors"))
                for name, t in full.items():  # exact: what actors load is the trainer's bits
                    assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (kind, i, name)
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(float(nbytes))
        finally:
            for w in writers:
                w.close()
    return _summary(out, warm)


def object_store_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: object_store`` path (``weights.delta_object_store``),
    ``weight_delta`` on against off, on a local Ray instance: per version, from the TU ranks'
    export call until the GU offers the snapshot to its actors (put + announce, then the GU's
    check for off; encode + put of the packed delta, then fetch + apply + put of the applied copy
    for on), and the bytes the TU put. Checked bit for bit through the actors' reader."""
    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import DeltaSettings, transport_for
    from mindspeed_rl.weights.transports.base import memory_reader

    store = transport_for("object_store")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in (("off", None), ("on", DeltaSettings(mode="on", full_interval=10**6))):
        run_id = f"bench-{kind}-{layout.world_size}-{time.monotonic_ns()}"
        writers = [
            store.exporter(Path("/nonexistent"), 2, run_id=run_id, delta=delta)
            for _ in range(layout.world_size)
        ]
        gu = store.gu_end(Path("/nonexistent"), delta=delta, gu_id=0)
        try:
            for i, full in enumerate(versions):
                shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
                tic = time.perf_counter()
                futures = [w.export(i + 1, shards[r].items(), layout, r) for r, w in enumerate(writers)]
                results = [f.result() for f in futures]
                (handle,) = [r.handle for r in results if r.handle is not None]
                done = gu.convert(i + 1, memory_path(i + 1), handle)
                seconds = time.perf_counter() - tic
                assert done.path is not None
                weights, _ = memory_reader(gu.reload_handle(done.path))()
                got = dict(weights)
                for name, t in full.items():  # exact: what actors load is the trainer's bits
                    assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (kind, i, name)
                del got, weights
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(float(sum(r.bytes_written for r in results)))
        finally:
            for w in writers:
                w.close()
                if hasattr(w, "release_all"):
                    w.release_all()
    return _summary(out, warm)


class _GuOnAnotherNode:
    """A GU of ``object_store`` and one actor-side reader, in a Ray actor on the second node."""

    def __init__(self, delta_mode: str) -> None:
        from mindspeed_rl.weights.transports import DeltaSettings, transport_for

        delta = None if delta_mode == "off" else DeltaSettings(mode="on", full_interval=10**6)
        self.gu = transport_for("object_store").gu_end(Path("/nonexistent"), delta=delta, gu_id=0)

    def refresh(self, version: int, path: str, handle: Any) -> dict[str, int]:
        """Convert, then read the version as an actor on this node does (the fetch and, for a TP
        merge, the merge); the xxh3_64 of each loaded tensor's bits, for the driver to check."""
        import xxhash

        from mindspeed_rl.weights.transports.base import memory_reader

        done = self.gu.convert(version, path, handle)
        weights, _ = memory_reader(self.gu.reload_handle(done.path))()
        return {name: xxhash.xxh3_64_intdigest(words(t, copy=False)) for name, t in weights}


def object_store_two_node_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], warm: int = 0
) -> dict[str, Any]:
    """``weight_transport: object_store`` with the GU on another node of a Ray test cluster (two
    raylets on this host; Ray's object manager moves objects between their stores over loopback
    TCP, what a cluster does over its network). Per version, from the TU ranks' export call (in
    this driver, on the head node) until a reader on the GU's node has loaded it: for off the
    GU's check, then the reader's fetch of every byte across nodes; for on the GU's fetch of the
    packed deltas, its apply and its put on its own node, then the reader's local fetch. Both
    include the reader's merge for TP2 -> TP1 (object_store's actors merge). Checked bit for
    bit (xxh3_64 of each loaded tensor against the trainer's)."""
    import ray
    import xxhash
    from ray.cluster_utils import Cluster

    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import DeltaSettings, transport_for

    store = transport_for("object_store")
    expected = [
        {name: xxhash.xxh3_64_intdigest(words(t, copy=False)) for name, t in full.items()}
        for full in versions
    ]
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 3 * 10**9})
    cluster.add_node(num_cpus=1, resources={"gu_node": 1}, object_store_memory=3 * 10**9)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        remote_gu = ray.remote(num_cpus=0, resources={"gu_node": 1})(_GuOnAnotherNode)
        for kind, delta in (("off", None), ("on", DeltaSettings(mode="on", full_interval=10**6))):
            run_id = f"bench-xnode-{kind}-{layout.world_size}-{time.monotonic_ns()}"
            writers = [
                store.exporter(Path("/nonexistent"), 2, run_id=run_id, delta=delta)
                for _ in range(layout.world_size)
            ]
            gu = remote_gu.remote(kind)
            try:
                for i, full in enumerate(versions):
                    shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
                    tic = time.perf_counter()
                    futures = [w.export(i + 1, shards[r].items(), layout, r) for r, w in enumerate(writers)]
                    results = [f.result() for f in futures]
                    (handle,) = [r.handle for r in results if r.handle is not None]
                    digests = ray.get(gu.refresh.remote(i + 1, memory_path(i + 1), handle))
                    seconds = time.perf_counter() - tic
                    assert digests == expected[i], (kind, i)  # exact: what the reader loaded
                    if i > 0:
                        out[f"{kind}_s"].append(seconds)
                        out[f"{kind}_bytes"].append(float(sum(r.bytes_written for r in results)))
            finally:
                for w in writers:
                    w.close()
                    if hasattr(w, "release_all"):
                        w.release_all()
                ray.kill(gu)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return _summary(out, warm)


def collective_case(
    layout: TrainingLayout, versions: list[dict[str, torch.Tensor]], bucket_mb: float, warm: int = 0
) -> dict[str, Any]:
    """The real ``weight_transport: collective`` path (``weights.delta_collective``), ``weight_delta``
    on against off, over a gloo group per GU (TU ranks and the GU's receiver on threads of this
    process, on a local Ray instance for the GU's puts): per version, from the TU ranks' export
    call until the GU offers the snapshot to its actors (pack + send, then receive + convert per
    bucket + put for off; the GU's answer, encode + pack + send of the packed delta, then receive +
    apply + put of the applied copy for on), and the bytes the TU sent. Checked bit for bit through
    the actors' reader."""
    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import DeltaSettings, transport_for
    from mindspeed_rl.weights.transports.base import memory_reader

    coll = transport_for("collective")
    out: dict[str, list[float]] = {"on_s": [], "off_s": [], "on_bytes": [], "off_bytes": []}
    for kind, delta in (("off", None), ("on", DeltaSettings(mode="on", full_interval=10**6))):
        run_id = f"bench-coll-{kind}-{layout.world_size}-{time.monotonic_ns()}"
        gu = coll.gu_end(Path("/nonexistent"), delta=delta, gu_id=0)
        channel = gu.open_channel(0, layout.world_size + 1, "gloo")
        writers = [
            coll.exporter(
                Path("/nonexistent"), 2, run_id=run_id, channels=[channel], bucket_mb=bucket_mb, delta=delta
            )
            for _ in range(layout.world_size)
        ]
        try:
            for i, full in enumerate(versions):
                shards = tp_ranks(layout, full) if layout.world_size > 1 else [full]
                sent_before = sum(w.stats()["collective_bytes_sent"] for w in writers)
                tic = time.perf_counter()
                futures = [w.export(i + 1, shards[r].items(), layout, r) for r, w in enumerate(writers)]
                for f in futures:
                    f.result()
                done = gu.convert(i + 1, memory_path(i + 1))
                seconds = time.perf_counter() - tic
                assert done.path is not None
                weights, _ = memory_reader(gu.reload_handle(done.path))()
                got = dict(weights)
                for name, t in full.items():  # exact: what actors load is the trainer's bits
                    assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), (kind, i, name)
                del got, weights
                if i > 0:
                    out[f"{kind}_s"].append(seconds)
                    out[f"{kind}_bytes"].append(
                        sum(w.stats()["collective_bytes_sent"] for w in writers) - sent_before
                    )
        finally:
            for w in writers:
                w.close()  # lets its group go: the GU's receiver then ends
    return _summary(out, warm)


def _summary(all_refreshes: dict[str, list[float]], warm: int = 0) -> dict[str, Any]:
    """Medians over the refreshes after the first ``warm`` (each list keeps them all)."""
    if warm >= len(all_refreshes["on_s"]):
        raise SystemExit(
            f"--warm-refreshes {warm} leaves no refresh of {len(all_refreshes['on_s'])}: add --steps"
        )
    out = {key: values[warm:] for key, values in all_refreshes.items()}
    return {
        "per_refresh": all_refreshes,
        "warm_refreshes": warm,
        "delta_s": statistics.median(out["on_s"]),
        "full_s": statistics.median(out["off_s"]),
        "seconds_ratio": statistics.median(d / f for d, f in zip(out["on_s"], out["off_s"], strict=True)),
        "bytes_ratio": statistics.median(
            d / f for d, f in zip(out["on_bytes"], out["off_bytes"], strict=True)
        ),
        "delta_bytes": statistics.median(out["on_bytes"]),
        "full_bytes": statistics.median(out["off_bytes"]),
    }


def _local_ray() -> None:
    """The object_store and collective cases' Ray: local, no dashboard (their puts go to this
    host's shared memory)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)


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
    media: list[tuple[str, Callable[[bytes], bytes]]] = [("memory", memory_medium)]
    with tempfile.TemporaryDirectory() as tmp:
        model_path = create_tiny_model(Path(tmp) / "model", arch(args), seed=0)
        for lr in [float(x) for x in args.lrs.split(",")]:
            engine = engine_for(model_path, lr)
            versions = [snapshot(engine)]
            params = sum(t.numel() for t in versions[0].values())
            results["params"] = params
            results["dtype"] = str(next(iter(versions[0].values())).dtype)
            changed, sparse_frac, xor_frac, xor_s, encode_s, apply_s = [], [], [], [], [], []
            for step in range(args.steps):
                tic = time.perf_counter()
                update(engine, step)
                print(f"lr={lr:g} step {step + 1}: update {time.perf_counter() - tic:.1f}s", flush=True)
                versions.append(snapshot(engine))
                old = {k: words(v) for k, v in versions[-2].items()}
                new = {k: words(v) for k, v in versions[-1].items()}
                changed.append(sum(int((old[k] != new[k]).sum()) for k in new) / params)
                link = DeltaLink(DeltaEncoder("on"), DeltaReceiver())
                link.refresh(0, versions[-2], lambda r: r)
                m = link.refresh(1, versions[-1], lambda r: r)
                full_bytes = sum(w.nbytes for w in new.values())
                sparse_frac.append(m["delta_bytes_sent"] / full_bytes)
                encode_s.append(m["delta_encode_seconds"])
                apply_s.append(m["delta_apply_seconds"])
                xb, xs = xor_zlib(old, new)
                xor_frac.append(xb / full_bytes)
                xor_s.append(xs)
            del engine
            case: dict[str, Any] = {
                "changed_fraction": changed,
                "sparse_bytes_fraction": sparse_frac,
                "sparse_encode_s": encode_s,
                "sparse_apply_s": apply_s,
                "xor_zlib1_bytes_fraction": xor_frac,
                "xor_zlib1_encode_s": xor_s,
                "full_bytes": float(sum(t.numel() * t.element_size() for t in versions[0].values())),
            }
            for case_name, layout in (
                ("identity", TrainingLayout()),
                ("tp2_to_tp1", TrainingLayout(tp_size=2, rules=hf_dense_rules())),
            ):
                warm = args.warm_refreshes
                case[f"{case_name}/shared_fs_wired"] = wired_case(layout, versions, Path(tmp), warm)
                case[f"{case_name}/object_store_wired"] = object_store_case(layout, versions, warm)
                case[f"{case_name}/collective_wired"] = collective_case(
                    layout, versions, args.bucket_mb, warm
                )
                if args.two_node:
                    ray.shutdown()  # the local instance makes way for a two-node test cluster
                    case[f"{case_name}/object_store_two_node"] = object_store_two_node_case(
                        layout, versions, warm
                    )
                    _local_ray()
                for medium_name, carry in media:
                    r = refresh_case(layout, versions, carry)
                    case[f"{case_name}/{medium_name}"] = {
                        "delta_s": statistics.median(r["delta_s"]),
                        "full_s": statistics.median(r["full_s"]),
                        "seconds_ratio": statistics.median(
                            d / f for d, f in zip(r["delta_s"], r["full_s"], strict=True)
                        ),
                        "bytes_ratio": statistics.median(
                            d / f for d, f in zip(r["delta_bytes"], r["full_bytes"], strict=True)
                        ),
                    }
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
