"""The megatron engine as a Training Unit's engines: policy, sharded reference, per-rank snapshot.

Each rank of a ``TrainingGroup`` builds one Training Unit around these (``TrainingUnit(...,
engines=megatron_engines)`` is the default when the plan carries a ``MegatronLayout``)::

    rank r: MegatronTrainingEngine ─ snapshot_shard() ─► (megatron names, r's shapes), ShardCoords
              │                                              │
              │   layout rank = tp + TP x (ep + EP x pp)    ▼
              └──────────────────────────────────► SnapshotPart(tensors, manifest layout, rank | None)

Data-parallel replicas hold the same shard as a lower rank: only the first rank of each
(tp, ep, pp) coordinate writes (rank None for the others), so a snapshot has exactly
TP x EP x PP shards whatever the DP size. The others do not even copy their shard to host
memory: their coordinates come from megatron's parallel state, not from the shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.distributed as dist

from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
from mindspeed_rl.models.training.megatron.groups import host_group
from mindspeed_rl.models.training.megatron.hf_export import first_holders, layout_rank, snapshot_layout
from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel
from mindspeed_rl.weights.megatron_dims import ShardCoords

if TYPE_CHECKING:
    from mindspeed_rl.contracts import TrainerSpec
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.workers.training_unit import Engines, SnapshotPart


__all__ = ["MegatronSnapshots", "first_holders", "layout_rank", "manifest_layout", "megatron_engines"]


class MegatronSnapshots:
    """``SnapshotPart`` of this rank; the first call is a collective (every rank calls it)."""

    def __init__(
        self,
        engine: MegatronTrainingEngine,
        coords_of: Callable[[MegatronTrainingEngine], ShardCoords] | None = None,
    ) -> None:
        self._engine = engine
        self._coords_of = coords_of or _parallel_coords
        self._writes: bool | None = None
        self._layout: TrainingLayout | None = None
        self._coords: ShardCoords | None = None

    def __call__(self) -> SnapshotPart:
        from mindspeed_rl.workers.training_unit import SnapshotPart

        if self._writes is None:
            coords = self._coords_of(self._engine)
            gathered: list[ShardCoords | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, coords, group=host_group())
            self._writes = first_holders([c for c in gathered if c is not None])[dist.get_rank()]
            self._layout = manifest_layout(self._engine, coords)
            self._coords = coords
        assert self._layout is not None and self._coords is not None
        if not self._writes:
            # Another rank writes this shard: copying it to host here would be thrown away.
            return SnapshotPart(tensors=(), layout=self._layout, rank=None)
        tensors, coords = self._engine.snapshot_shard()
        if coords != self._coords:
            raise RuntimeError(
                f"snapshot shard coordinates changed from {self._coords} to {coords}; the parallel "
                "layout is fixed for a run, restart the Training Unit to change it"
            )
        return SnapshotPart(tensors=tensors.items(), layout=self._layout, rank=layout_rank(coords))


def _parallel_coords(engine: MegatronTrainingEngine) -> ShardCoords:
    from mindspeed_rl.models.training.megatron.model import rank_coords

    return rank_coords(engine.layout)


def manifest_layout(engine: MegatronTrainingEngine, coords: ShardCoords) -> TrainingLayout:
    return snapshot_layout(engine.dims, coords)


def megatron_engines(spec: TrainerSpec, policy_path: str) -> Engines:
    from mindspeed_rl.workers.training_unit import Engines

    layout = spec.megatron
    if layout is None:
        raise ValueError("megatron_engines needs a plan with a MegatronLayout (use_mcore_models: true)")
    if not dist.is_initialized():
        raise ValueError(
            "the megatron engine runs inside a TrainingGroup (torch.distributed initialised per rank); "
            "create the Training Unit with workers.training_group, not as one plain actor"
        )
    engine = MegatronTrainingEngine(policy_path, spec.engine, layout)
    reference = (
        MegatronReferenceModel(
            policy_path,
            layout,
            micro_batch_size=spec.reference_micro_batch_size,
            pad_token_id=spec.engine.pad_token_id,
            seed=spec.engine.seed,
            device=spec.engine.device,
            param_dtype=spec.engine.param_dtype,
            offload=spec.offload_reference,
        )
        if spec.reference_micro_batch_size is not None
        else None
    )
    return Engines(engine=engine, reference=reference, snapshot=MegatronSnapshots(engine))
