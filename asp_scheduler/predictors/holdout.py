"""Shared helpers for fitting and scoring predictors on prompt-length pairs.

Traces often hold several sampled responses per prompt. ``group_by_prompt`` collapses them to one
entry per prompt id; ``split_by_prompt`` keeps every id on one side of a held-out split, so a
predictor is never scored on a prompt whose other samples it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from asp_scheduler.predictors.base import LengthPredictor, PredictorQuality, PromptItem, evaluate_predictor


@dataclass(frozen=True, slots=True)
class PromptGroups:
    """Rows of (prompt, length) collapsed to one entry per distinct prompt id (first-seen order)."""

    prompts: list[PromptItem]
    mean_log_length: np.ndarray
    log_mean_length: np.ndarray
    counts: np.ndarray
    row_to_group: np.ndarray


def group_by_prompt(prompts: Sequence[PromptItem], lengths: np.ndarray) -> PromptGroups:
    """Validate ``(prompts, lengths)`` and collapse repeated prompt ids."""
    values = np.asarray(lengths, dtype=np.float64)
    if values.ndim != 1 or values.shape[0] != len(prompts):
        raise ValueError(
            f"got {len(prompts)} prompts but lengths of shape {values.shape}; pass one length per prompt row"
        )
    if len(prompts) == 0:
        raise ValueError("no prompt-length pairs given; pass at least one measured (prompt, length) pair")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        bad = int(np.flatnonzero(~np.isfinite(values) | (values <= 0))[0])
        raise ValueError(
            f"length {values[bad]!r} of prompt {prompts[bad].prompt_id!r} (row {bad}) is not a positive finite "
            "token count; drop failed generations or clip lengths to at least 1"
        )
    index: dict[str, int] = {}
    unique: list[PromptItem] = []
    row_to_group = np.empty(len(prompts), dtype=np.int64)
    for row, item in enumerate(prompts):
        group = index.setdefault(item.prompt_id, len(unique))
        if group == len(unique):
            unique.append(item)
        elif unique[group].text != item.text:
            raise ValueError(
                f"prompt id {item.prompt_id!r} appears with two different texts (row {row}); "
                "give every distinct prompt its own id"
            )
        row_to_group[row] = group
    counts = np.bincount(row_to_group, minlength=len(unique)).astype(np.float64)
    mean_log = np.bincount(row_to_group, weights=np.log(values), minlength=len(unique)) / counts
    mean = np.bincount(row_to_group, weights=values, minlength=len(unique)) / counts
    return PromptGroups(unique, mean_log, np.log(mean), counts, row_to_group)


def split_by_prompt(
    prompts: Sequence[PromptItem], *, holdout_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, test) with every prompt id entirely on one side, so no prompt leaks."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction={holdout_fraction!r} must be in (0, 1), e.g. 0.2")
    ids = list(dict.fromkeys(p.prompt_id for p in prompts))
    if len(ids) < 2:
        raise ValueError(
            f"a held-out split needs at least 2 distinct prompt ids, got {len(ids)}; add more prompts"
        )
    num_test = min(max(1, round(holdout_fraction * len(ids))), len(ids) - 1)
    order = np.random.default_rng(seed).permutation(len(ids))
    test_ids = {ids[i] for i in order[:num_test]}
    is_test = np.fromiter((p.prompt_id in test_ids for p in prompts), dtype=bool, count=len(prompts))
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def holdout_quality(
    predictor: LengthPredictor,
    prompts: Sequence[PromptItem],
    lengths: np.ndarray,
    *,
    holdout_fraction: float = 0.2,
    seed: int = 0,
) -> PredictorQuality:
    """Fit on a prompt-grouped split; score held-out rows (single samples, not per-prompt means)."""
    values = np.asarray(lengths, dtype=np.float64)
    train, test = split_by_prompt(prompts, holdout_fraction=holdout_fraction, seed=seed)
    predictor.fit([prompts[i] for i in train], values[train])
    predicted = predictor.predict([prompts[i] for i in test])
    return evaluate_predictor(predicted, values[test])
