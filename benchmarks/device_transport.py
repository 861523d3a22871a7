"""The collective weight transport's round trip for ``device_check``'s ``collective`` stage.

The model's weights, as a TU rank exports them (a host copy), go through the transport's own code
on both ends: ``pack`` into buckets, ``send_packed`` (each bucket moved to the device and sent),
the GU's ``CollectiveReceiver`` (``recv_header``/``recv_buckets`` into device memory, one copy to
the host, the conversion digest), then ``fetch_tensors`` / ``iter_converted`` as an actor loads
them; every tensor must come back bit-equal.

On the GPU the channel is ONE NCCL rank: NCCL refuses two ranks of a communicator on one device
("Duplicate GPU detected", NCCL's init.cc), so a second process on the same GPU cannot join. The
group is the transport's own ``join_group`` with ``ChannelAddress(backend="nccl")`` set here
directly (no config key selects the backend yet: issue #39, defect 7), of world size one; the
channel's two logical ranks (TU rank 0, GU receiver rank 1) both map onto it, and each receive is
issued together with the send it matches in one group call (``_start_coalescing`` /
``_end_coalescing``, ncclGroupStart/End: NCCL runs a send to its own rank only that way). On a CPU
host gloo has neither a send to self nor group calls, so the same code runs over a two-rank gloo
group, the receiver on its own thread as in a GU.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

GB = 1e9


class _Done:
    def wait(self) -> bool:
        return True


class SelfLoop:
    """A one-rank group carrying a channel's two logical ranks: ``send`` holds the tensor, ``recv``
    sends the oldest held one and receives it in one group call. Sends and receives must match in
    order and size, as the transport's framing guarantees (header length, header, buckets)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._held: deque[Any] = deque()
        self.group_calls = 0

    def send(self, tensors: list[Any], dst: int, tag: int) -> _Done:
        self._held.append(tensors[0])
        return _Done()

    def recv(self, tensors: list[Any], src: int, tag: int) -> Any:
        if not self._held:
            raise RuntimeError("a receive with no send before it: the channel's framing is out of step")
        sent = self._held.popleft()
        if sent.nbytes != tensors[0].nbytes:
            raise RuntimeError(f"sent {sent.nbytes} bytes, receiving {tensors[0].nbytes}: out of step")
        # torch 2.11's Backend._start_coalescing() / _end_coalescing() (no arguments), bound on
        # every backend; ProcessGroupNCCL groups the two p2p ops into one ncclGroupStart/End.
        self._group._start_coalescing()
        self._group.send([sent], 0, tag)
        self._group.recv(tensors, 0, tag)
        self.group_calls += 1
        return self._group._end_coalescing()


def _weights(model_dir: Path, device: str) -> dict[str, Any]:
    """The model's tensors on ``device`` (where a trainer holds them), from its safetensors."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(file), device=device))
    if not out:
        raise FileNotFoundError(f"{model_dir} has no .safetensors file")
    return out


def _copy(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in arrays]


def collective_round_trip(model_dir: Path, *, device: str, bucket_mb: float) -> dict[str, Any]:
    import torch

    from mindspeed_rl.weights.collective import (
        Backend,
        ChannelAddress,
        bucket_device,
        join_group,
        open_store,
        pack,
        send_packed,
    )
    from mindspeed_rl.weights.collective_receiver import CollectiveReceiver, ReceivedSnapshots
    from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
    from mindspeed_rl.weights.memory_snapshot import fetch_tensors, host_array, iter_converted

    backend: Backend = "nccl" if device == "cuda" else "gloo"
    on_device = _weights(model_dir, device)
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.cuda.synchronize()
    tic = time.perf_counter()
    host = {name: t.detach().cpu() for name, t in on_device.items()}  # the export's copy (snapshot_shard)
    export_s = time.perf_counter() - tic
    tic = time.perf_counter()
    packed = pack(1, "devicecheck", 0, host.items(), TrainingLayout(), max(1, int(bucket_mb * 1e6)))
    pack_s = time.perf_counter() - tic
    nbytes = sum(b.nbytes for b in packed.buckets)
    store = open_store("127.0.0.1", 1 if backend == "nccl" else 2)
    # The channel as a GU announces it: TU rank 0 sends, the receiver is rank 1 (world_size - 1).
    address = ChannelAddress(gu_id=0, host="127.0.0.1", port=store.port, world_size=2, backend=backend)
    received = ReceivedSnapshots()
    # ``put`` copies, as ray.put does into the object store: the receiver reuses a bucket's memory
    # for a later round once its tensors are put, so keeping views would read overwritten bytes.
    receiver = CollectiveReceiver(address, store, InferenceLayout(), received, put=_copy)
    figures: dict[str, Any] = {
        "backend": backend, "tensors": len(host), "bytes": nbytes, "buckets": len(packed.buckets),
        "bucket_mb": bucket_mb, "export_s": export_s, "pack_s": pack_s,
    }  # fmt: skip
    tic = time.perf_counter()
    if backend == "nccl":
        one_rank = ChannelAddress(gu_id=0, host="127.0.0.1", port=store.port, world_size=1, backend="nccl")
        loop = SelfLoop(join_group(one_rank, 0, store=store))
        figures["mode"] = "one NCCL rank (world 1): each receive grouped with its send"
        send_packed(loop, packed, address.receiver_rank, bucket_device(backend))
        receiver.group = loop
        # The receiver's loop body, called here: its thread (``start``) would join a group of its own.
        receiver._receive_version()
        figures["group_calls"] = loop.group_calls
    else:
        figures["mode"] = "two gloo ranks (world 2): the receiver on its own thread, as in a GU"
        receiver.start()
        group = join_group(address, 0)
        send_packed(group, packed, address.receiver_rank, bucket_device(backend))
    snapshot = received.wait_for(1, timeout=120.0)
    transfer_s = time.perf_counter() - tic
    if isinstance(snapshot, str):
        raise RuntimeError(f"the receiver reported no snapshot: {snapshot}")
    tensors = fetch_tensors(snapshot, get=lambda parts: parts)  # ``put`` kept the arrays (copies) themselves
    loaded = dict(iter_converted(snapshot, tensors, InferenceLayout()))
    unequal = [
        name for name, t in host.items()
        if name not in loaded or not np.array_equal(host_array(t), host_array(loaded[name]))
    ]  # fmt: skip
    figures.update(
        transfer_s=transfer_s, transfer_gb_per_s=nbytes / GB / transfer_s if transfer_s > 0 else None,
        bytes_received=receiver.bytes_received, bit_equal=not unequal and len(loaded) == len(host),
        unequal=unequal[:5], extra=sorted(set(loaded) - set(host))[:5],
    )  # fmt: skip
    if not figures["bit_equal"]:
        from benchmarks.device_stages import StageFailed

        raise StageFailed("weights came back different from what was sent", figures)
    return figures
