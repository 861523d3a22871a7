"""The streamed merge of one snapshot: plan on meta tensors, then convert group by group.

``plan_conversion`` runs every rename, unfuse, merge, vocab trim and split of the conversion on
meta tensors, so each output file's header (and every consistency check) is fixed before a tensor
byte is read; ``run_conversion`` then reads, merges and writes one group of tensors at a time (a
name's TP/EP pieces, or a fused tensor's parts) at its planned offset, so host memory is bounded by
the largest group, not by the model (see ``convert.py`` for the whole conversion and its checks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from mindspeed_rl.weights.hostcopy import copy_into
from mindspeed_rl.weights.layout import InferenceLayout, TrainingLayout
from mindspeed_rl.weights.manifest import ShardEntry, SnapshotError, SnapshotManifest, TensorEntry
from mindspeed_rl.weights.merge import (
    MergePlan,
    NameMap,
    Piece,
    UnfuseRule,
    expert_owners,
    plan_merge,
    split_for_rank,
    unfuse_piece,
)
from mindspeed_rl.weights.shardio import (
    ReadJob,
    default_io_threads,
    open_shards,
    read_into,
    read_tensor,
    torch_dtype,
)

logger = logging.getLogger(__name__)
_G = TypeVar("_G")

Finalize = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""The after-merge step of a naming scheme (megatron: trim the vocab padding). It is applied to
each group of merged tensors on its own, so it must treat every tensor by itself."""
Alloc = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]
"""Memory for a merged tensor: ``alloc(shape, dtype)`` (e.g. a reused ``hostcopy.Arena``)."""
Sink = Callable[[int, str, torch.Tensor], None]
"""Receives each converted tensor: ``sink(inference rank, name, tensor)``; called from worker threads."""


def conversion_steps(training: TrainingLayout, name_map: NameMap | None) -> tuple[NameMap, Finalize | None]:
    """The name map and after-merge step for a snapshot: from its layout's ``naming`` when it
    records one (a megatron snapshot: unfuse + rename, then trim the vocab padding), else the
    caller's map (default identity: HF names already)."""
    if training.naming is None:
        return name_map or NameMap(), None
    if training.naming.get("scheme") == "megatron":
        from mindspeed_rl.weights import megatron_rules

        return megatron_rules.convert_steps(training)
    raise SnapshotError(
        f"snapshot naming scheme {training.naming.get('scheme')!r} is unknown to this GU; "
        "convert with the same version of the framework that exported it"
    )


@dataclass(frozen=True, slots=True)
class _Source:
    """One tensor of one training shard, and where its unfused parts go."""

    shard: ShardEntry
    entry: TensorEntry
    unfused: bool
    targets: tuple[tuple[str, int], ...]
    """Per part: (output name, index of the part among that output's merge pieces)."""


@dataclass(frozen=True, slots=True)
class _Group:
    """Training tensors whose outputs depend on each other only: read, merged and written together."""

    sources: tuple[_Source, ...]
    merges: dict[str, MergePlan]
    final: dict[str, torch.Tensor]
    """Meta tensors: the group's outputs after the after-merge step, before the split per rank."""
    cost: int
    """Bytes held at most while it converts (upper bound); what `_run_bounded` budgets."""


@dataclass(frozen=True, slots=True)
class ConversionPlan:
    """What a conversion will write, worked out on meta tensors before any tensor byte is read."""

    manifest: SnapshotManifest
    groups: tuple[_Group, ...]
    per_rank: tuple[dict[str, torch.Tensor], ...]
    """Meta tensors of each inference rank's file."""
    owners: dict[str, int]
    rules: tuple[UnfuseRule, ...]
    finalize: Finalize | None


_PLANS: OrderedDict[tuple[Any, ...], ConversionPlan] = OrderedDict()
_PLANS_LOCK = threading.Lock()
_PLANS_KEPT = 4
"""Plans of the last few snapshot structures. Every refresh of a run has the same names, shapes,
dtypes and partitions, only new bytes: planning on meta tensors costs ~0.14 ms per tensor here
(0.33 s measured for the 2,403 tensors of the 1 GiB benchmark model; at that rate ~2.5 s for an
MoE of ~18k, not measured), paid once instead of at every refresh."""


def plan_conversion(
    manifest: SnapshotManifest, layout: InferenceLayout, *, name_map: NameMap | None = None
) -> ConversionPlan:
    """Every check of the merge (names, partitions, ranks, shapes, divisibility) and the output
    files' contents, from the manifest alone: meta tensors run the same unfuse, merge, after-merge
    and split code as the conversion itself, so the plan cannot disagree with what it writes.

    A manifest of a structure planned before gets that plan, bound to this manifest (its
    checksums and version); the plan reads nothing else of the manifest's entries."""
    key = _structure_key(manifest, layout, name_map)
    with _PLANS_LOCK:
        cached = _PLANS.get(key)
        if cached is not None:
            _PLANS.move_to_end(key)
    if cached is not None:
        return dataclasses.replace(cached, manifest=manifest)
    plan = _plan_conversion(manifest, layout, name_map)
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return plan


def _structure_key(
    manifest: SnapshotManifest, layout: InferenceLayout, name_map: NameMap | None
) -> tuple[Any, ...]:
    """What a plan depends on: both layouts, the name map, and every shard's and tensor's
    name, place, shape, dtype and partition (not the bytes, checksums or version)."""
    return (
        json.dumps(manifest.layout, sort_keys=True),
        json.dumps(layout.to_json(), sort_keys=True),
        name_map,
        tuple((s.file, s.rank, s.coords, s.nbytes) for s in manifest.shards),
        tuple(
            (e.shard_file, e.name, tuple(e.shape), e.dtype, e.nbytes, e.partition) for e in manifest.tensors
        ),
    )


def _plan_conversion(
    manifest: SnapshotManifest, layout: InferenceLayout, name_map: NameMap | None
) -> ConversionPlan:
    training = manifest.training_layout()
    names, finalize = conversion_steps(training, name_map)
    sources: dict[str, list[tuple[ShardEntry, TensorEntry]]] = defaultdict(list)
    for shard in manifest.shards:
        for entry in manifest.tensors_in(shard.file):
            sources[entry.name].append((shard, entry))
    outputs_of = {
        name: [
            names.rename(part.name)
            for shard, entry in held
            for part in unfuse_piece(_meta_piece(shard, entry), names.unfuse)
        ]
        for name, held in sources.items()
    }
    world = layout.world_size
    groups = []
    for members in _connected(outputs_of):
        group_sources = [pair for name in members for pair in sources[name]]
        by_output: dict[str, list[Piece]] = defaultdict(list)
        targets: list[list[tuple[str, int]]] = []
        unfused: list[bool] = []
        for shard, entry in group_sources:
            parts = unfuse_piece(_meta_piece(shard, entry), names.unfuse)
            unfused.append(len(parts) != 1 or parts[0].name != entry.name)
            mine = []
            for part in parts:
                output = names.rename(part.name)
                mine.append((output, len(by_output[output])))
                by_output[output].append(part)
            targets.append(mine)
        merges = {
            name: plan_merge(name, group, training.tp_size, training.ep_size)
            for name, group in by_output.items()
        }
        full = {name: torch.empty(m.shape, dtype=m.dtype, device="meta") for name, m in merges.items()}
        final = finalize(full) if finalize is not None else full
        merged_bytes = sum(_nbytes(t) for t in full.values())
        largest_source = max(e.nbytes for _, e in group_sources)
        cost = merged_bytes + 2 * largest_source + (merged_bytes if world > 1 else 0)
        groups.append(
            _Group(
                sources=tuple(
                    _Source(shard=shard, entry=entry, unfused=u, targets=tuple(t))
                    for (shard, entry), u, t in zip(group_sources, unfused, targets, strict=True)
                ),
                merges=merges,
                final=final,
                cost=cost,
            )
        )
    all_final = [name for g in groups for name in g.final]
    if len(all_final) != len(set(all_final)):
        raise SnapshotError(
            f"snapshot v{manifest.version}: the name map gives two groups the same output name; "
            "fix its rename rules"
        )
    owners = expert_owners(all_final, layout) if world > 1 else {}
    per_rank: tuple[dict[str, torch.Tensor], ...] = tuple({} for _ in range(world))
    for group in groups:
        for rank in range(world):
            per_rank[rank].update(split_for_rank(group.final, layout, rank, owners=owners))
    return ConversionPlan(
        manifest=manifest,
        groups=tuple(groups),
        per_rank=per_rank,
        owners=owners,
        rules=names.unfuse,
        finalize=finalize,
    )


def _meta_piece(shard: ShardEntry, entry: TensorEntry) -> Piece:
    tensor = torch.empty(entry.shape, dtype=torch_dtype(entry.dtype), device="meta")
    return Piece(name=entry.name, tensor=tensor, spec=entry.partition, coords=shard.coords)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _connected(outputs_of: dict[str, list[str]]) -> list[list[str]]:
    """Source names grouped so that no output draws on two groups (in first-seen order)."""
    owner: dict[str, str] = {}  # output name -> first source name that produced it
    parent = {name: name for name in outputs_of}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name, outputs in outputs_of.items():
        for output in outputs:
            if output in owner:
                parent[root(name)] = root(owner[output])
            else:
                owner[output] = name
    groups: dict[str, list[str]] = {}
    for name in outputs_of:
        groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def run_conversion(
    snapshot_dir: Path, plan: ConversionPlan, layout: InferenceLayout, sink: Sink, *, num_threads: int | None
) -> None:
    """Read, verify, merge and split every group of ``plan``, handing each output tensor to ``sink``."""
    manifest = plan.manifest
    with open_shards(snapshot_dir, manifest, manifest.shards) as jobs:
        by_key = {(job.entry.shard_file, job.entry.name): job for job in jobs}

        def convert(group: _Group) -> None:
            _convert_group(group, plan, by_key, layout, sink)

        _run_bounded(list(plan.groups), [g.cost for g in plan.groups], convert, num_threads)


def run_groups_bounded(plan: ConversionPlan, work: Callable[[_Group], None], num_threads: int | None) -> None:
    """``work(group)`` for every group of ``plan`` on up to ``num_threads`` threads, bytes in
    flight bounded as in `run_conversion`."""
    _run_bounded(list(plan.groups), [g.cost for g in plan.groups], work, num_threads)


def group_keys(group: _Group) -> tuple[tuple[str, str], ...]:
    """The ``(shard file, tensor name)`` of every training tensor a group converts from: a
    receiver that gets tensors piecemeal (``collective``) converts a group once all are in."""
    return tuple((source.shard.file, source.entry.name) for source in group.sources)


def convert_group_in_memory(
    group: _Group,
    plan: ConversionPlan,
    tensors: Mapping[tuple[str, str], torch.Tensor],
    layout: InferenceLayout,
    sink: Sink,
    *,
    alloc: Alloc | None = None,
) -> None:
    """`run_conversion`'s work for one group, from tensors already in memory (keyed by
    ``group_keys``): object_store and collective snapshots, where no file exists. ``alloc``
    gives the merged tensors their memory (default: fresh); the sink must be done with a
    tensor before that memory is reused."""
    _convert_group(group, plan, tensors, layout, sink, alloc)


def _convert_group(
    group: _Group,
    plan: ConversionPlan,
    jobs: Mapping[tuple[str, str], ReadJob | torch.Tensor],
    layout: InferenceLayout,
    sink: Sink,
    alloc: Alloc | None = None,
) -> None:
    merged: dict[str, torch.Tensor] = {
        name: alloc(merge.shape, merge.dtype) if alloc is not None else merge.empty()
        for name, merge in group.merges.items()
        if not merge.single
    }
    for source in group.sources:
        job = jobs[(source.shard.file, source.entry.name)]
        if not source.unfused and isinstance(job, ReadJob):
            output, index = source.targets[0]
            merge = group.merges[output]
            if not merge.single and (view := merged[output][merge.places[index]]).is_contiguous():
                read_into(job, view)  # its slice of the merged tensor is contiguous: no copy
                continue
        tensor = read_tensor(job) if isinstance(job, ReadJob) else job
        piece = Piece(
            name=source.entry.name, tensor=tensor, spec=source.entry.partition, coords=source.shard.coords
        )
        parts = unfuse_piece(piece, plan.rules)
        for part, (output, index) in zip(parts, source.targets, strict=True):
            merge = group.merges[output]
            if merge.single:
                merged[output] = part.tensor
            else:
                copy_into(merged[output][merge.places[index]], part.tensor)
        del tensor, piece, parts
    full = plan.finalize(merged) if plan.finalize is not None else merged
    for name, want in group.final.items():
        got = full[name]
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise RuntimeError(
                f"{name}: converted to {got.dtype}{list(got.shape)} but planned as {want.dtype}"
                f"{list(want.shape)}; the after-merge step must treat each tensor on its own (see Finalize)"
            )
    for rank in range(layout.world_size):
        for name, tensor in split_for_rank(full, layout, rank, owners=plan.owners).items():
            sink(rank, name, tensor)


def _run_bounded(
    items: list[_G], costs: list[int], work: Callable[[_G], None], num_threads: int | None
) -> None:
    """``work(item)`` for every item on up to ``num_threads`` threads, while the costs of the items
    in flight together stay within the largest single cost (one item always runs)."""
    threads = num_threads or default_io_threads()
    if threads <= 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    budget = _Budget(max(costs))

    def run(item: _G, cost: int) -> None:
        try:
            work(item)
        except BaseException as err:
            budget.fail(err)
        finally:
            budget.release(cost)

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="snapshot-convert") as pool:
        for item, cost in zip(items, costs, strict=True):
            if not budget.acquire(cost):
                break
            pool.submit(run, item, cost)
    budget.raise_failure()


class _Budget:
    """Bytes in flight across threads; a request waits until it fits or nothing else runs."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._cond = threading.Condition()
        self._errors: list[BaseException] = []

    def acquire(self, cost: int) -> bool:
        """Wait for room for ``cost``; False once a worker failed (stop submitting)."""
        with self._cond:
            self._cond.wait_for(lambda: self._fits(cost))
            if self._errors:
                return False
            self._used += cost
            return True

    def _fits(self, cost: int) -> bool:
        return bool(self._errors) or self._used == 0 or self._used + cost <= self._limit

    def release(self, cost: int) -> None:
        with self._cond:
            self._used -= cost
            self._cond.notify_all()

    def fail(self, err: BaseException) -> None:
        with self._cond:
            self._errors.append(err)
            self._cond.notify_all()

    def raise_failure(self) -> None:
        if self._errors:
            raise self._errors[0]
