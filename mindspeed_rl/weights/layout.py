"""How tensors are partitioned on the training side and on the generation side.

A layout is a set of parallel sizes plus a rule table that maps a tensor name
to its `PartitionSpec`. The same description serves both ends of the weight
flow: the exporter uses it to decide which rank writes what, the converter to
merge training shards and to slice for a GU's inference ranks.

Rank numbering (our convention, stated once): TP varies fastest, then EP, then
PP, i.e. ``rank = tp_rank + tp_size * (ep_rank + ep_size * pp_rank)``. Data
parallel replicas hold identical weights, so only DP rank 0 of each model
replica exports (the caller decides which processes call `export`).

No torch import here: the Control Unit reads layouts from manifests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionSpec:
    """How one tensor is laid out across ranks.

    - ``tp_dim``: split along this dim across TP ranks (0 = column parallel /
      vocab parallel, 1 = row parallel); ``None`` = identical on every TP rank.
    - ``ep_dim``: stacked experts split along this dim across EP ranks
      (Megatron grouped GEMM); ``None`` = not split by EP.
    - ``ep_local``: the tensor exists on exactly one EP rank (HF per-expert
      naming, ``...experts.<e>...``); mutually exclusive with ``ep_dim``.
    Pipeline stages always own disjoint names, so PP needs no field.
    """

    tp_dim: int | None = None
    ep_dim: int | None = None
    ep_local: bool = False

    def __post_init__(self) -> None:
        if self.ep_local and self.ep_dim is not None:
            raise ValueError(
                f"PartitionSpec(ep_dim={self.ep_dim}, ep_local=True) is contradictory: a tensor is either "
                "split along a dim across EP ranks or owned whole by one EP rank; set only one of them"
            )
        for label, dim in (("tp_dim", self.tp_dim), ("ep_dim", self.ep_dim)):
            if dim is not None and dim < 0:
                raise ValueError(f"PartitionSpec.{label}={dim} is negative; use a non-negative dim index")

    @property
    def is_replicated(self) -> bool:
        return self.tp_dim is None and self.ep_dim is None and not self.ep_local

    def to_json(self) -> dict[str, Any]:
        return {"tp_dim": self.tp_dim, "ep_dim": self.ep_dim, "ep_local": self.ep_local}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionSpec:
        return cls(tp_dim=data["tp_dim"], ep_dim=data["ep_dim"], ep_local=bool(data["ep_local"]))


REPLICATED = PartitionSpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRule:
    """``pattern`` is a regex matched with `re.search` against the tensor name.

    For ``ep_local`` rules the pattern must capture the expert index in a named
    group ``expert`` so that inference EP ranks can pick their experts.
    """

    pattern: str
    spec: PartitionSpec

    def __post_init__(self) -> None:
        compiled = re.compile(self.pattern)
        if self.spec.ep_local and "expert" not in compiled.groupindex:
            raise ValueError(
                f"ep_local rule {self.pattern!r} has no named group 'expert'; write it like "
                r"r'\.experts\.(?P<expert>\d+)\.'"
            )


def _resolve(rules: tuple[PartitionRule, ...], name: str) -> PartitionSpec:
    for rule in rules:
        if re.search(rule.pattern, name):
            return rule.spec
    return REPLICATED


def _check_sizes(**sizes: int) -> None:
    for label, size in sizes.items():
        if size < 1:
            raise ValueError(f"{label}={size} must be >= 1 (use 1 for 'not parallel')")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCoords:
    tp_rank: int = 0
    ep_rank: int = 0
    pp_rank: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingLayout:
    """Parallel layout of the Training Unit; rules are matched in order, default replicated."""

    tp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    rules: tuple[PartitionRule, ...] = field(default_factory=tuple)
    naming: dict[str, Any] | None = None
    """None: tensors carry HF names. Otherwise how the GU's convert renames them, e.g.
    ``{"scheme": "megatron", ...}`` (``megatron_rules.training_layout``); JSON-able."""

    def __post_init__(self) -> None:
        _check_sizes(tp_size=self.tp_size, pp_size=self.pp_size, ep_size=self.ep_size)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size * self.ep_size

    def spec_for(self, name: str) -> PartitionSpec:
        return _resolve(self.rules, name)

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"rank {rank} is outside this layout (tp={self.tp_size} x ep={self.ep_size} x "
                f"pp={self.pp_size} = {self.world_size} ranks); pass the rank within the model replica"
            )
        tp_rank = rank % self.tp_size
        ep_rank = (rank // self.tp_size) % self.ep_size
        pp_rank = rank // (self.tp_size * self.ep_size)
        return RankCoords(tp_rank=tp_rank, ep_rank=ep_rank, pp_rank=pp_rank)

    def writes(self, spec: PartitionSpec, coords: RankCoords) -> bool:
        """Whether this rank writes a tensor: replicated copies are written once, by coordinate 0."""
        tp_ok = spec.tp_dim is not None or coords.tp_rank == 0
        ep_ok = spec.ep_dim is not None or spec.ep_local or coords.ep_rank == 0
        return tp_ok and ep_ok

    def to_json(self) -> dict[str, Any]:
        out = {
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "ep_size": self.ep_size,
            "rules": [{"pattern": r.pattern, "spec": r.spec.to_json()} for r in self.rules],
        }
        if self.naming is not None:
            out["naming"] = self.naming
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainingLayout:
        rules = tuple(
            PartitionRule(pattern=r["pattern"], spec=PartitionSpec.from_json(r["spec"]))
            for r in data["rules"]
        )
        return cls(
            tp_size=data["tp_size"],
            pp_size=data["pp_size"],
            ep_size=data["ep_size"],
            rules=rules,
            naming=data.get("naming"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceLayout:
    """Layout of one generation actor's engine (TP x EP ranks inside the actor)."""

    tp_size: int = 1
    ep_size: int = 1
    rules: tuple[PartitionRule, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        _check_sizes(tp_size=self.tp_size, ep_size=self.ep_size)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.ep_size

    def spec_for(self, name: str) -> PartitionSpec:
        return _resolve(self.rules, name)

    def rule_for(self, name: str) -> PartitionRule | None:
        for rule in self.rules:
            if re.search(rule.pattern, name):
                return rule
        return None

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"inference rank {rank} is outside this layout (tp={self.tp_size} x ep={self.ep_size}); "
                f"pass a rank in [0, {self.world_size})"
            )
        return RankCoords(tp_rank=rank % self.tp_size, ep_rank=rank // self.tp_size)

    def to_json(self) -> dict[str, Any]:
        return {
            "tp_size": self.tp_size,
            "ep_size": self.ep_size,
            "rules": [{"pattern": r.pattern, "spec": r.spec.to_json()} for r in self.rules],
        }


def hf_dense_rules() -> tuple[PartitionRule, ...]:
    """Megatron-style TP placement expressed on HF (Qwen/Llama) names.

    Column parallel (output dim split): q/k/v, gate/up, embeddings, lm_head.
    Row parallel (input dim split): o_proj, down_proj. Norms are replicated.
    """
    column = PartitionSpec(tp_dim=0)
    row = PartitionSpec(tp_dim=1)
    return (
        PartitionRule(pattern=r"\.experts\.(?P<expert>\d+)\.(gate|up)_proj\.", spec=_local_column()),
        PartitionRule(pattern=r"\.experts\.(?P<expert>\d+)\.down_proj\.", spec=_local_row()),
        PartitionRule(pattern=r"\.(q|k|v)_proj\.(weight|bias)$", spec=column),
        PartitionRule(pattern=r"\.(gate|up)_proj\.weight$", spec=column),
        PartitionRule(pattern=r"\.(o|down)_proj\.weight$", spec=row),
        PartitionRule(pattern=r"(embed_tokens|lm_head)\.weight$", spec=column),
    )


def _local_column() -> PartitionSpec:
    return PartitionSpec(tp_dim=0, ep_local=True)


def _local_row() -> PartitionSpec:
    return PartitionSpec(tp_dim=1, ep_local=True)
