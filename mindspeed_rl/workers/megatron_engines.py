"""The megatron engine as a Training Unit's engines: policy, sharded reference, per-rank snapshot.

Each rank of a ``TrainingGroup`` builds one Training Unit around these (``TrainingUnit(...,
engines=megatron_engines)`` is the default when the plan carries a ``MegatronLayout``)::

    rank r: MegatronTrainingEngine ─ snapshot_shard() ─► (megatron names, r's shapes), ShardCoords
              │                                              │
              │   layout rank = tp + TP x (ep + EP x pp)    ▼
              └──────────────────────────────────► SnapshotPart(tensors, manifest layout, rank | None)

Data-parallel replicas hold the same shard as a lower rank: only the first rank of each
(tp, ep, pp) coordinate writes (rank None for the others), so a snapshot has exactly
TP x EP x PP shards whatever the DP size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from mindspeed_rl.models.training.megatron.engine import MegatronReferenceModel, MegatronTrainingEngine
from mindspeed_rl.models.training.megatron.hf_mapping import ShardCoords

if TYPE_CHECKING:
    from mindspeed_rl.contracts import TrainerSpec
    from mindspeed_rl.weights.layout import TrainingLayout
    from mindspeed_rl.workers.training_unit import Engines, SnapshotPart


def layout_rank(coords: ShardCoords) -> int:
    """This rank's index in the snapshot layout (``weights.layout``'s numbering)."""
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


class MegatronSnapshots:
    """``SnapshotPart`` of this rank; the first call is a collective (every rank calls it)."""

    def __init__(self, engine: MegatronTrainingEngine) -> None:
        self._engine = engine
        self._writes: bool | None = None
        self._layout: TrainingLayout | None = None

    def __call__(self) -> SnapshotPart:
        from mindspeed_rl.workers.training_unit import SnapshotPart

        tensors, coords = self._engine.snapshot_shard()
        if self._writes is None:
            gathered: list[ShardCoords | None] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, coords)
            self._writes = first_holders([c for c in gathered if c is not None])[dist.get_rank()]
            self._layout = manifest_layout(self._engine, coords)
        assert self._layout is not None
        rank = layout_rank(coords) if self._writes else None
        return SnapshotPart(tensors=tensors.items(), layout=self._layout, rank=rank)


def manifest_layout(engine: MegatronTrainingEngine, coords: ShardCoords) -> TrainingLayout:
    from mindspeed_rl.weights import megatron_rules

    return megatron_rules.training_layout(
        tp_size=coords.tp_size,
        pp_size=coords.pp_size,
        ep_size=coords.ep_size,
        expert_tensor_parallel_size=coords.etp_size,
        dims=engine.dims,
    )


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
        )
        if spec.reference_micro_batch_size is not None
        else None
    )
    return Engines(engine=engine, reference=reference, snapshot=MegatronSnapshots(engine))
