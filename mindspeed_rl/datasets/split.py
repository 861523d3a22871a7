"""Megatron's ``split`` (train,valid,test weights) applied to a prompt set: held-out prompts.

The weights are proportions, normalised by their sum as Megatron does ("90,10,0", "969,30,1").
Which prompt lands in which part is a seeded permutation, so the parts are disjoint, the same
for the same seed and data, and independent of the source order of the file; inside a part the
prompts keep their source order. The valid and test sizes are rounded from the proportions and
the train part takes the rest, so a non-zero weight can round to an empty part on tiny data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindspeed_rl.datasets.records import PromptRecord

# Separate seed stream: the split must not shift when another consumer of the run seed changes.
_SPLIT_STREAM = 7


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitWeights:
    train: float
    valid: float
    test: float

    @property
    def train_fraction(self) -> float:
        return self.train / (self.train + self.valid + self.test)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptSplits:
    """The three disjoint parts; training sees only ``train``."""

    train: tuple[PromptRecord, ...]
    valid: tuple[PromptRecord, ...]
    test: tuple[PromptRecord, ...]


def parse_split(split: str) -> SplitWeights:
    """``"90,10,0"`` -> weights; ValueError naming the problem for anything else."""
    parts = [p.strip() for p in str(split).replace("/", ",").split(",")]
    if len(parts) != 3:
        raise ValueError(
            f"megatron_training.split={split!r} has {len(parts)} value(s); write three "
            "train,valid,test weights, e.g. '90,10,0'"
        )
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"megatron_training.split={split!r} holds a non-number; write three numbers, e.g. '90,10,0'"
        ) from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"megatron_training.split={split!r}: weights must be finite and >= 0")
    if values[0] <= 0:
        raise ValueError(
            f"megatron_training.split={split!r} leaves nothing to train on; give the first (train) "
            "weight a positive value, e.g. '90,10,0'"
        )
    return SplitWeights(train=values[0], valid=values[1], test=values[2])


def part_sizes(num_prompts: int, weights: SplitWeights) -> tuple[int, int, int]:
    """(train, valid, test) counts for ``num_prompts`` prompts."""
    total = weights.train + weights.valid + weights.test
    num_valid = round(num_prompts * weights.valid / total)
    num_test = round(num_prompts * weights.test / total)
    return num_prompts - num_valid - num_test, num_valid, num_test


def prompts_to_generate(num_train: int, weights: SplitWeights) -> int:
    """Smallest generated set whose train part still holds ``num_train`` prompts (built-in tasks)."""
    num = math.ceil(num_train / weights.train_fraction)
    while part_sizes(num, weights)[0] < num_train:
        num += 1
    return num


def split_prompts(records: Sequence[PromptRecord], split: str, seed: int) -> PromptSplits:
    """Disjoint train / valid / test parts of ``records``, by a permutation seeded with ``seed``.

    The unit of the split is a distinct prompt (its token ids), not a record: a dataset (or a
    generated task) that holds the same prompt twice under two ids keeps both copies in one part,
    so no evaluated prompt was ever trained on. Part sizes count distinct prompts.
    """
    weights = parse_split(split)
    group_of: dict[tuple[int, ...], int] = {}
    groups = [group_of.setdefault(tuple(r.token_ids), len(group_of)) for r in records]
    num_train, num_valid, _ = part_sizes(len(group_of), weights)
    order = np.random.default_rng([seed, _SPLIT_STREAM]).permutation(len(group_of))
    part_of = np.empty(len(group_of), dtype=np.int8)
    part_of[order[:num_train]] = 0
    part_of[order[num_train : num_train + num_valid]] = 1
    part_of[order[num_train + num_valid :]] = 2
    parts: tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]] = ([], [], [])
    for record, group in zip(records, groups):
        parts[int(part_of[group])].append(record)
    return PromptSplits(train=tuple(parts[0]), valid=tuple(parts[1]), test=tuple(parts[2]))


def write_split_ids(path: str | Path, splits: PromptSplits) -> None:
    """Which prompt ids went to which part, as JSON (``{"train": [...], "valid": [...], "test": [...]}``),
    so a run's held-out set can be audited and reused."""
    ids = {name: [r.prompt_id for r in getattr(splits, name)] for name in ("train", "valid", "test")}
    Path(path).write_text(json.dumps(ids) + "\n", encoding="utf-8")
