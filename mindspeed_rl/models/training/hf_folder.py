"""HF model folders an engine writes: the non-weight files (config, generation config, tokenizer,
chat template) carried over so the folder loads on its own, and the weights of a sharded engine
merged from its ranks' shards by the weight library's rules, one tensor group at a time::

    training rank r's shard (snapshot names and format) ─ RankShardWriter ─► <folder>/rank-<r>.safetensors
    every rank's shard ─ merge_plan (the GU's plan_conversion, one inference rank) ─┬─► write_merged: one
                                                                                    │   model.safetensors
                                                                                    └─► read_merged: tensors

The merge is the GU's convert (``weights/convert.py``): unfuse, rename and merge per tensor group
with each piece's checksum verified as it is read, so the host holds about one merged group at a
time, never the whole model twice.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mindspeed_rl.weights.layout import PartitionSpec, TrainingLayout
    from mindspeed_rl.weights.manifest import ShardEntry, TensorEntry
    from mindspeed_rl.weights.streaming_merge import ConversionPlan

NON_WEIGHT_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


# How a tiny model was built (``trainer/policy_model.py``): true of that folder only, never of a
# checkpoint or final model trained from it, so it is not copied along.
BUILD_RECORD = "mindspeed_rl_build.json"


def copy_non_weight_files(source: Path, target: Path) -> None:
    """Copy ``source``'s non-weight files into ``target``; a file ``target`` already holds (the
    writer's own config or shard index) is kept, and a folder is never copied onto itself."""
    if target.resolve() == source.resolve():
        return
    for f in source.iterdir():
        copyable = (
            f.is_file()
            and f.suffix in NON_WEIGHT_SUFFIXES
            and ".safetensors" not in f.name
            and f.name != BUILD_RECORD
        )
        if copyable and not (target / f.name).exists():
            shutil.copy2(f, target / f.name)


def rank_shard_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def written_specs(layout: TrainingLayout, rank: int, names: Iterable[str]) -> dict[str, PartitionSpec]:
    """The tensors of ``names`` that layout rank ``rank`` writes (a replicated tensor is written by
    coordinate 0 only, as a snapshot export does), with their partition specs."""
    coords = layout.coords(rank)
    specs = {}
    for name in names:
        spec = layout.spec_for(name)
        if layout.writes(spec, coords):
            specs[name] = spec
    return specs


class RankShardWriter:
    """One training rank's shard in ``folder``, planned from names, shapes and dtypes (meta
    tensors will do) and written one tensor at a time, in any order."""

    def __init__(
        self, folder: Path, layout: TrainingLayout, rank: int, planned: Mapping[str, torch.Tensor]
    ) -> None:
        from mindspeed_rl.weights.shardio import PlannedShard

        specs = written_specs(layout, rank, planned)
        if set(specs) != set(planned):
            raise ValueError(
                f"layout rank {rank} does not write {sorted(set(planned) - set(specs))[:3]}; select its "
                "tensors with written_specs first"
            )
        self._rank = rank
        self._coords = layout.coords(rank)
        self._file = rank_shard_file(rank)
        self._shard = PlannedShard(folder / self._file, dict(planned), specs)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """``tensor``: a CPU tensor of the planned shape and dtype."""
        self._shard.write(name, tensor)

    def finish(self) -> tuple[ShardEntry, tuple[TensorEntry, ...]]:
        from mindspeed_rl.weights.manifest import ShardEntry

        try:
            nbytes, entries = self._shard.finish()
        finally:
            self._shard.close()
        return ShardEntry(file=self._file, rank=self._rank, coords=self._coords, nbytes=nbytes), entries

    def close(self) -> None:
        self._shard.close()


def merge_plan(
    layout: TrainingLayout, shards: Iterable[ShardEntry], tensors: Iterable[TensorEntry]
) -> ConversionPlan:
    """The GU's conversion plan of the rank shards written by :class:`RankShardWriter` into one
    unsplit set of HF tensors (every name, shape and merge checked before a byte is read)."""
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.manifest import SnapshotError, SnapshotManifest
    from mindspeed_rl.weights.streaming_merge import plan_conversion

    ordered = tuple(sorted(shards, key=lambda s: s.rank))
    if [s.rank for s in ordered] != list(range(layout.world_size)):
        raise SnapshotError(
            f"rank shards {[s.rank for s in ordered]} do not cover the {layout.world_size} ranks of the layout"
        )
    manifest = SnapshotManifest(
        version=0,
        created_unix=time.time(),
        kind="training",
        layout=layout.to_json(),
        shards=ordered,
        tensors=tuple(tensors),
    )
    return plan_conversion(manifest, InferenceLayout())


def write_merged(folder: Path, plan: ConversionPlan, target: Path, *, num_threads: int | None = None) -> None:
    """The merged tensors of ``plan`` (rank shards in ``folder``) as one safetensors file."""
    from mindspeed_rl.weights.layout import REPLICATED, InferenceLayout
    from mindspeed_rl.weights.shardio import PlannedShard
    from mindspeed_rl.weights.streaming_merge import run_conversion

    (planned,) = plan.per_rank
    out = PlannedShard(target, planned, dict.fromkeys(planned, REPLICATED))
    try:
        run_conversion(
            folder,
            plan,
            InferenceLayout(),
            lambda _rank, name, t: out.write(name, t),
            num_threads=num_threads,
        )
        out.finish()
    finally:
        out.close()


def read_merged(
    folder: Path, plan: ConversionPlan, *, num_threads: int | None = None
) -> dict[str, torch.Tensor]:
    """The merged tensors of ``plan`` in host memory, by HF name (in the plan's order)."""
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.streaming_merge import run_conversion

    got: dict[str, torch.Tensor] = {}
    lock = threading.Lock()

    def keep(_rank: int, name: str, tensor: torch.Tensor) -> None:
        with lock:
            got[name] = tensor

    run_conversion(folder, plan, InferenceLayout(), keep, num_threads=num_threads)
    (planned,) = plan.per_rank
    return {name: got[name] for name in planned}
