"""The colocated hybrid's weight push: every rank gets the whole HF model, one group at a time,
device to device, for the rollout engine rank living in the same process.

::

    rank r (trainer shard + one engine TP rank)        for each conversion group g:
      shard tensors of g ── broadcast from their ──►     every rank holds g's pieces on its device
                            first holder (world group)    ─► merged with the GU's rules (device)
                                                          ─► yielded to the engine's loader, dropped

In upstream's colocated layout an engine rank sits in every trainer rank's process (vLLM's
``external_launcher``); vLLM's loader takes full HF tensors and keeps its own TP slice, so every
rank needs every merged tensor once. The pieces come from the (tp, ep, pp) shard's first holder
(``hf_export.ShardCollector``: DP replicas send nothing) and travel over the default process
group, the device's own collective (NCCL / HCCL; gloo on a CPU host). The merge is the
snapshot converter's plan (``streaming_merge``, planned once on meta tensors, cached), applied on
the device group by group: at any time a rank holds one group's pieces and merged tensors on top
of its own shard and the engine's parameters, never a second model. Nothing goes through host
memory, unlike ``gather_hf_weights`` (rank 0's host, for ``save_hf`` and the two-process push).

Collective and lazy: the returned stream runs its broadcasts as the engine consumes it, so every
rank must consume it whole and in the same order (each rank's engine loads every name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.rollout.weight_stream import WeightStream
from mindspeed_rl.models.training.megatron.groups import host_group
from mindspeed_rl.models.training.megatron.hf_export import ShardCollector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.weights.megatron_dims import GPTDims
    from mindspeed_rl.weights.streaming_merge import ConversionPlan


class DeviceWeightBroadcast:
    """Streams of the full HF weights on every rank (collective: build it on every rank)."""

    def __init__(self, dims: GPTDims, layout: MegatronLayout) -> None:
        self._collector = ShardCollector(dims, layout)
        self._plan: ConversionPlan | None = None
        self._source_rank: dict[tuple[str, str], int] = {}

    def stream(self, model: torch.nn.Module) -> WeightStream:
        """The HF-named weights of ``model``'s current parameters, on this rank's device."""
        from mindspeed_rl.weights.memory_snapshot import shard_key

        layout_rank = self._collector.writers[dist.get_rank()]  # None: a DP replica, it sends nothing
        mine = self._collector.own_shard(model) if layout_rank is not None else {}
        if self._plan is None:
            self._plan = self._make_plan(mine)
        plan = self._plan
        own = shard_key(layout_rank) if layout_rank is not None else None
        device = next(model.parameters()).device
        return WeightStream(
            shapes=tuple((name, tuple(t.shape)) for name, t in plan.per_rank[0].items()),
            tensors=self._tensors(plan, mine, own, device),
        )

    def _make_plan(self, mine: dict[str, torch.Tensor]) -> ConversionPlan:
        """The converter's plan for every writer's shard, from names, shapes and dtypes only
        (gathered once: they do not change during a run)."""
        from mindspeed_rl.models.training.hf_folder import merge_plan
        from mindspeed_rl.weights.manifest import ShardEntry
        from mindspeed_rl.weights.memory_snapshot import entry_for, shard_key

        local = [(name, tuple(t.shape), t.dtype) for name, t in mine.items()]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local, group=host_group())
        layout = self._collector.layout
        shards, entries = [], []
        for src, layout_rank in enumerate(self._collector.writers):
            if layout_rank is None:
                continue
            key = shard_key(layout_rank)
            metas = [torch.empty(shape, dtype=dtype, device="meta") for _, shape, dtype in gathered[src]]
            written = [
                entry_for(name, meta, key=key, layout=layout)
                for (name, _, _), meta in zip(gathered[src], metas, strict=True)
            ]
            nbytes = sum(e.nbytes for e in written)
            shards.append(
                ShardEntry(file=key, rank=layout_rank, coords=layout.coords(layout_rank), nbytes=nbytes)
            )
            entries.extend(written)
            for entry in written:
                self._source_rank[(key, entry.name)] = src
        return merge_plan(layout, shards, entries)

    def _tensors(
        self, plan: ConversionPlan, mine: dict[str, torch.Tensor], own: str | None, device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor]]:
        from mindspeed_rl.weights.layout import InferenceLayout
        from mindspeed_rl.weights.memory_snapshot import collect_rank
        from mindspeed_rl.weights.shardio import torch_dtype
        from mindspeed_rl.weights.streaming_merge import convert_group_in_memory

        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        whole = InferenceLayout()
        for group in plan.groups:
            pieces: dict[tuple[str, str], torch.Tensor] = {}
            for source in group.sources:
                key = (source.shard.file, source.entry.name)
                if key[0] == own:
                    tensor = mine[source.entry.name].contiguous()
                else:
                    entry = source.entry
                    tensor = torch.empty(entry.shape, dtype=torch_dtype(entry.dtype), device=device)
                dist.broadcast(tensor, src=self._source_rank[key])
                pieces[key] = tensor
            out: list[tuple[str, torch.Tensor]] = []
            convert_group_in_memory(group, plan, pieces, whole, collect_rank(out, 0), alloc=alloc)
            del pieces
            yield from out
