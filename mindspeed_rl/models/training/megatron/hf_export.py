"""The engine's weights leave shard by shard, to rank 0's host, over the gloo host group.

Each (tp, ep, pp) shard's first holder (DP replicas skip) exports its snapshot-format shard
(``param_names.export_shard``) and sends it to rank 0 one tensor at a time (names, shapes and
dtypes first); rank 0 writes each into a rank shard file as it arrives and merges them with the
GU's rules (``hf_folder``, ``weights.megatron_rules``). No rank ever holds another rank's shard
on its device, and neither side holds more than its own shard plus one tensor. Serves
``save_hf``, the hybrid push, evaluation and the Training Unit's snapshots (``layout_rank``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.training.hf_folder import (
    RankShardWriter,
    copy_non_weight_files,
    merge_plan,
    read_merged,
    write_merged,
    written_specs,
)
from mindspeed_rl.models.training.megatron.groups import host_group
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.model import rank_coords
from mindspeed_rl.models.training.megatron.param_names import export_shard, is_weight_name
from mindspeed_rl.weights.megatron_dims import GPTDims, ShardCoords

if TYPE_CHECKING:
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.weights.manifest import ShardEntry, TensorEntry
    from mindspeed_rl.weights.streaming_merge import ConversionPlan

HF_WEIGHTS_FILE = "model.safetensors"
_SHARD_STAGING = ".rank-shards"


def layout_rank(coords: ShardCoords) -> int:
    """A rank's index in the snapshot layout (``weights.layout``'s numbering)."""
    return coords.tp_rank + coords.tp_size * (coords.ep_rank + coords.ep_size * coords.pp_rank)


def first_holders(all_coords: list[ShardCoords]) -> list[bool]:
    """Per global rank: whether it is the lowest rank holding its (tp, ep, pp) shard."""
    seen: set[int] = set()
    out = []
    for coords in all_coords:
        key = layout_rank(coords)
        out.append(key not in seen)
        seen.add(key)
    return out


def snapshot_layout(dims: GPTDims, coords: ShardCoords) -> TrainingLayout:
    """The manifest layout of this engine's shards (``weights.megatron_rules``)."""
    from mindspeed_rl.weights import megatron_rules

    return megatron_rules.training_layout(
        tp_size=coords.tp_size,
        pp_size=coords.pp_size,
        ep_size=coords.ep_size,
        expert_tensor_parallel_size=coords.etp_size,
        dims=dims,
    )


def weight_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's weights as they are (on the device, no copy)."""
    return {
        name: t.detach()
        for name, t in model.state_dict().items()
        if is_weight_name(name) and isinstance(t, torch.Tensor)
    }


class ShardCollector:
    """Brings every shard's first holder's snapshot-format shard to rank 0's host (collective).

    Writers send over the host group one tensor at a time (names, shapes and dtypes first), and
    rank 0 writes each into a rank shard file as it arrives, so neither side holds more than its
    own shard plus one tensor; nothing of another rank ever reaches a device.
    """

    def __init__(self, dims: GPTDims, layout: MegatronLayout) -> None:
        self._dims = dims
        self._coords = rank_coords(layout)
        gathered: list[ShardCoords | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self._coords, group=host_group())
        holders = first_holders([c for c in gathered if c is not None])
        self.writers: list[int | None] = [
            layout_rank(c) if first and c is not None else None
            for c, first in zip(gathered, holders, strict=True)
        ]
        """Per global rank: the layout rank whose shard it writes, or None (a DP replica)."""
        self.layout = snapshot_layout(dims, self._coords)

    def own_shard(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        rank = self.writers[dist.get_rank()]
        assert rank is not None
        exported = export_shard(weight_tensors(model), self._dims, self._coords)
        return {name: exported[name] for name in written_specs(self.layout, rank, exported)}

    def collect(self, model: torch.nn.Module, folder: Path | None) -> ConversionPlan | None:
        """Rank 0: writes every shard into ``folder`` and returns the merge plan; others: send
        their shard (if they write one) and return None. ``model``: anything whose
        ``state_dict()`` holds megatron-named tensors of this rank."""
        group = host_group()
        me = dist.get_rank()
        if me != 0:
            if self.writers[me] is not None:
                tensors = self.own_shard(model)
                meta = [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
                dist.send_object_list([meta], dst=0, group=host_group())
                for t in tensors.values():
                    dist.send(t.cpu().contiguous(), dst=0, group=group)
            return None
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        shards: list[ShardEntry] = []
        entries: list[TensorEntry] = []
        for src, rank in enumerate(self.writers):
            if rank is None:
                continue
            if src == 0:
                own = self.own_shard(model)
                writer = RankShardWriter(folder, self.layout, rank, own)
                for name, t in own.items():
                    writer.write(name, t.cpu())
            else:
                received: list[Any] = [None]
                dist.recv_object_list(received, src=src, group=host_group())
                planned = {n: torch.empty(s, dtype=d, device="meta") for n, s, d in received[0]}
                writer = RankShardWriter(folder, self.layout, rank, planned)
                for name, t in planned.items():
                    buffer = torch.empty(t.shape, dtype=t.dtype)
                    dist.recv(buffer, src=src, group=group)
                    writer.write(name, buffer)
            shard, written = writer.finish()
            shards.append(shard)
            entries.extend(written)
        return merge_plan(self.layout, shards, entries)


def gather_hf_weights(
    model: torch.nn.Module, dims: GPTDims, layout: MegatronLayout, *, collector: ShardCollector | None = None
) -> dict[str, torch.Tensor]:
    """The full HF-named tensors of ``model``'s shards on rank 0's host, ``{}`` on the other ranks
    (collective): the hybrid push, evaluation and checks. Shards reach rank 0 through a
    temporary folder of its own (:class:`ShardCollector`; pass one to spare its coordinate
    exchange)."""
    collector = collector or ShardCollector(dims, layout)
    if dist.get_rank() != 0:
        collector.collect(model, None)
        return {}
    with tempfile.TemporaryDirectory(prefix="mcore-hf-") as tmp:
        plan = collector.collect(model, Path(tmp))
        assert plan is not None
        return read_merged(Path(tmp), plan)


def save_hf_folder(
    collector: ShardCollector,
    model: torch.nn.Module,
    source: Path,
    path: str | os.PathLike[str],
) -> None:
    """An HF folder (one ``model.safetensors`` + ``source``'s config and tokenizer), written by
    rank 0 from every shard, merged on its host one tensor group at a time (collective)."""
    target = Path(path)
    staging = target / _SHARD_STAGING
    plan = collector.collect(model, staging if dist.get_rank() == 0 else None)
    if plan is not None:
        write_merged(staging, plan, target / HF_WEIGHTS_FILE)
        shutil.rmtree(staging)
        copy_non_weight_files(source, target)
    dist.barrier(group=host_group())
