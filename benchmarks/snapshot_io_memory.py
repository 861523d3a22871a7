"""``snapshot_io.py --transport object_store | collective``: the in-memory weight flows, timed as
the file flow is (export + convert + reload, to weights an engine can load), beside the raw speed
of the same medium on the same bytes in the same repeat.

- object_store: export = ``ObjectStoreExporter.export`` (the put into Ray's object store is its
  copy; TP2: two exporters on two threads, the flow waits for the slower); convert = the GU's
  checks and plan (the object_store GU end's ``convert``, no byte copied); reload = a Ray task (another process,
  as an actor is) fetching the buffers and draining ``iter_converted`` (zero-copy for tp1, the
  merge group by group for tp2_to_tp1). Raw: one plain in-memory copy of every tensor
  (``np.copy`` into fresh memory, one thread), the medium's own copy.
- collective: export = pack into buckets + the sends to a GU actor; convert = the receiver's
  per-bucket conversion and puts, overlapped with the receipt (timed until the GU holds the
  converted version); reload as for object_store. Raw: the same bucket sizes sent over a gloo
  group between the same two processes, nothing packed, converted or put.

Peak RSS: ``reload_peak_rss_gb`` in the reload task (VmHWM reset before, minus VmRSS before;
pages of the object store's shared memory the task touches count as resident);
``receive_peak_rss_gb`` in the GU actor (collective).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mindspeed_rl.weights.layout import TrainingLayout, hf_dense_rules

TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS") * 1024


def _peak_growth(before: int) -> int:
    return max(0, _status_kb("VmHWM") * 1024 - before)


def reload_task(handle: Any) -> dict[str, float]:
    """An actor's reload of ``handle``: fetch + check, then every tensor the engine would get."""
    from mindspeed_rl.weights.transports.base import memory_reader

    before = _reset_peak()
    started = time.perf_counter()
    weights, nbytes = memory_reader(handle)()
    n = 0
    for _, tensor in weights:
        n += tensor.numel() * tensor.element_size()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "bytes": float(n), "peak_rss_growth": float(_peak_growth(before))}


def tp_shard(model: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in model.items():
        spec = TP2.spec_for(name)
        out[name] = tensor.chunk(2, spec.tp_dim)[rank].contiguous() if spec.tp_dim is not None else tensor
    return out


def raw_memory_copy_seconds(model: dict[str, torch.Tensor]) -> float:
    arrays = [t.view(torch.int32).numpy() if t.element_size() == 4 else t.numpy() for t in model.values()]
    started = time.perf_counter()
    copies = [np.array(a, copy=True) for a in arrays]
    seconds = time.perf_counter() - started
    del copies
    return seconds


def raw_warm_copy_seconds(model: dict[str, torch.Tensor]) -> float:
    """The same copy into memory written once before (``np.copyto``): a copy's speed once its
    target pages are mapped, beside the plain copy's fresh pages (reported, not the ratio's)."""
    arrays = [t.view(torch.int32).numpy() if t.element_size() == 4 else t.numpy() for t in model.values()]
    targets = [np.ones_like(a) for a in arrays]
    started = time.perf_counter()
    for target, array in zip(targets, arrays, strict=True):
        np.copyto(target, array)
    return time.perf_counter() - started


class Reloader:
    """A generation actor's stand-in: one long-lived process that reloads every version, as an
    actor does over a run (its mappings of the store's shared memory persist between reloads)."""

    def reload(self, handle: Any) -> dict[str, float]:
        return reload_task(handle)


def _export_all(
    exporters: list[Any], shards: list[dict[str, torch.Tensor]], layout: TrainingLayout, version: int
) -> list[Any]:
    """Every rank's export of ``version``, ranks side by side on threads (as rank processes)."""
    futures: list[Any] = [None] * len(exporters)

    def put(rank: int) -> None:
        futures[rank] = exporters[rank].export(version, shards[rank].items(), layout, rank=rank)

    threads = [threading.Thread(target=put, args=(r,)) for r in range(len(exporters))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [f.result() for f in futures]


def object_store_flow(
    case: str, model: dict[str, torch.Tensor], run: int, warm_versions: int = 1
) -> dict[str, Any]:
    """``warm_versions`` versions first, untimed, each reloaded by one long-lived reloader (the
    board actor exists, and with 3 or more, ``keep_last + 1``, the timed version is put into
    store memory a freed version used: the steady state of a run, whose first refreshes pay fresh
    pages), then the next version, timed."""
    import ray

    from mindspeed_rl.weights.object_store import ObjectStoreExporter
    from mindspeed_rl.weights.transport import memory_path
    from mindspeed_rl.weights.transports import transport_for

    ranks = 1 if case == "tp1" else 2
    layout = TrainingLayout() if ranks == 1 else TP2
    shards = [model] if ranks == 1 else [tp_shard(model, r) for r in range(2)]
    keep = 2
    exporters = [ObjectStoreExporter(keep_last=keep, run_id=f"bench-{case}-{run}") for _ in range(ranks)]
    reloader = ray.remote(Reloader).options(num_cpus=0).remote()
    for version in range(warm_versions):
        warm = _export_all(exporters, shards, layout, version)
        ray.get(reloader.reload.remote(next(r.handle for r in warm if r.handle)))
        del warm
    timed = warm_versions
    results = _export_all(exporters, shards, layout, timed)
    handle = next(r.handle for r in results if r.handle is not None)
    stages = {
        "export_copy_s": max(r.prepare_seconds for r in results),
        "save_s": max(r.save_seconds - r.prepare_seconds for r in results),
    }
    convert = transport_for("object_store").gu_end(Path("/nonexistent"))
    started = time.perf_counter()
    convert.convert(timed, memory_path(timed), handle)
    stages["convert_s"] = time.perf_counter() - started
    reload = ray.get(reloader.reload.remote(handle))
    stages["reload_s"] = reload["seconds"]
    for e in exporters:
        e.close()
        e.release_all()
    ray.kill(reloader)
    del handle, results, convert
    raw = raw_memory_copy_seconds(model)
    return stages | {"raw_copy_s": raw, "raw_warm_copy_s": raw_warm_copy_seconds(model),
                     "reload_peak_rss_gb": reload["peak_rss_growth"] / 1e9, "timed_version": timed,
                     "raw_medium": "in-memory copy (np.copy per tensor, 1 thread)"}  # fmt: skip


class BenchGu:
    """A GU stand-in in its own process: the real collective GU end, plus a raw peer."""

    def __init__(self) -> None:
        from mindspeed_rl.weights.transports import transport_for

        self.weights = transport_for("collective").gu_end(Path("/nonexistent"))
        self._raw_group: Any = None
        self._rss_before = 0

    def open(self, world: int) -> Any:
        return self.weights.open_channel(0, world)

    def mark(self) -> None:
        self._rss_before = _reset_peak()

    def wait_version(self, version: int) -> dict[str, Any]:
        from mindspeed_rl.weights.transport import memory_path

        self.weights.convert(version, memory_path(version))
        return {
            "done_unix": time.time(),
            "handle": self.weights.reload_handle(memory_path(version)),
            "peak_rss_growth": float(_peak_growth(self._rss_before)),
        }

    def open_raw(self) -> Any:
        import ray

        from mindspeed_rl.weights.collective import ChannelAddress, join_group, open_store

        host = ray.util.get_node_ip_address()
        store = open_store(host, 2)
        address = ChannelAddress(gu_id=99, host=host, port=int(store.port), world_size=2)
        self._raw_store = store

        def join() -> None:
            self._raw_group = join_group(address, 1, store=store)

        self._joiner = threading.Thread(target=join)
        self._joiner.start()
        return address

    def recv_raw(self, sizes: list[int], reuse: bool = False) -> float:
        """Receive ``sizes`` from the raw peer: into fresh buckets, or (``reuse``) into the ones
        the previous call received into."""
        from mindspeed_rl.weights.collective import BucketPool, recv_buckets

        self._joiner.join()
        if not reuse or not hasattr(self, "_raw_pool"):
            self._raw_pool = BucketPool()
        pool = self._raw_pool
        for n in sizes:
            (bucket,) = recv_buckets(self._raw_group, [(0, n)], pool=pool)
            pool.give_back([bucket])
        return time.time()


def collective_flow(
    case: str, model: dict[str, torch.Tensor], run: int, bucket_mb: float, warm_versions: int = 1
) -> dict[str, Any]:
    import ray

    from mindspeed_rl.weights.collective import CollectiveSender, join_group

    ranks = 1 if case == "tp1" else 2
    gu = ray.remote(BenchGu).options(num_cpus=0, max_concurrency=4).remote()
    address = ray.get(gu.open.remote(ranks + 1))
    senders = [CollectiveSender([address], bucket_mb=bucket_mb, run_id=f"bench-{run}") for _ in range(ranks)]
    layout = TrainingLayout() if ranks == 1 else TP2
    shards = [model] if ranks == 1 else [tp_shard(model, r) for r in range(2)]
    # Untimed versions first: the group's rendezvous happens once per run (at start), the store's
    # shared memory and the senders' and receiver's buckets are touched once; a refresh of a
    # running pipeline pays none of these. One long-lived reloader, as an actor.
    reloader = ray.remote(Reloader).options(num_cpus=0).remote()
    for version in range(warm_versions):
        _export_all(senders, shards, layout, version)
        warm = ray.get(gu.wait_version.remote(version))
        ray.get(reloader.reload.remote(warm["handle"]))
        del warm
    timed = warm_versions
    ray.get(gu.mark.remote())
    started_unix = time.time()
    results = _export_all(senders, shards, layout, timed)
    done = ray.get(gu.wait_version.remote(timed))
    received_s = done["done_unix"] - started_unix
    copy_s = max(r.prepare_seconds for r in results)
    reload = ray.get(reloader.reload.remote(done["handle"]))
    stages = {
        "export_copy_s": copy_s,
        "save_s": max(0.0, received_s - copy_s),  # the sends, with the GU's per-bucket convert overlapped
        "convert_s": 0.0,
        "reload_s": reload["seconds"],
    }
    # Raw: the same bucket sizes over a gloo group between the same two processes.
    from mindspeed_rl.weights.collective import bucket_table

    sent = [
        [
            t.numel() * t.element_size()
            for n, t in shard.items()
            if layout.writes(layout.spec_for(n), layout.coords(r))
        ]
        for r, shard in enumerate(shards)
    ]
    sizes = [b[2] for nbytes in sent for b in bucket_table(nbytes, senders[0].bucket_bytes)]
    raw_address = ray.get(gu.open_raw.remote())
    raw_group = join_group(raw_address, 0)
    payload = [torch.ones(n, dtype=torch.uint8) for n in sizes]  # written pages, as a model's are

    def raw_send(reuse: bool) -> float:
        waiting = gu.recv_raw.remote(sizes, reuse)
        started = time.time()
        for tensor in payload:
            raw_group.send([tensor], 1, 0).wait()
        return ray.get(waiting) - started

    raw_s = raw_send(False)  # received into fresh memory (the figure of the earlier tables)
    raw_warm_s = raw_send(True)  # received into the same buckets again
    for s in senders:
        s.close()
    ray.kill(gu)
    ray.kill(reloader)
    payload.clear()
    return stages | {
        "raw_copy_s": raw_s,
        "raw_warm_copy_s": raw_warm_s,
        "timed_version": timed,
        "reload_peak_rss_gb": reload["peak_rss_growth"] / 1e9,
        "receive_peak_rss_gb": done["peak_rss_growth"] / 1e9,
        "bucket_mb": bucket_mb,
        "raw_medium": "gloo send of the same bucket sizes between the same processes",
    }
