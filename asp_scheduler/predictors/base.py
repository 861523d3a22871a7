"""The one interface every length predictor implements, plus its quality report.

A predictor maps prompts to predicted output lengths (tokens). Only the ranking matters
much to the scheduler (it sorts by prediction), so quality is reported as Kendall's tau
first and mean absolute error second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class PromptItem:
    """One schedulable item: a prompt (or one sampled response of it) and its text."""

    prompt_id: str
    text: str


class LengthPredictor(Protocol):
    """Prompts in, predicted output lengths out (float64, one per prompt, > 0)."""

    name: str

    def fit(self, prompts: Sequence[PromptItem], lengths: np.ndarray) -> LengthPredictor: ...

    def predict(self, prompts: Sequence[PromptItem]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class PredictorQuality:
    """Agreement between predicted and measured lengths on one evaluation set."""

    kendall_tau: float
    mae_tokens: float
    num_pairs: int


def evaluate_predictor(pred: np.ndarray, true: np.ndarray) -> PredictorQuality:
    """Kendall tau-b (ties handled; O(n log n)) and MAE of ``pred`` against ``true``."""
    from asp_scheduler.rank_correlation import kendall_tau_b

    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or pred.ndim != 1:
        raise ValueError(
            f"predictions and true lengths must be 1-D arrays of equal length, got shapes "
            f"{pred.shape} and {true.shape}; pass one prediction per measured item"
        )
    if pred.size < 2:
        raise ValueError(
            f"need at least 2 items to compute Kendall tau, got {pred.size}; evaluate on more items"
        )
    tau = kendall_tau_b(true, pred)
    if np.isnan(tau):
        # Constant predictions (or constant truths) carry no ranking information at all.
        tau = 0.0
    mae = float(np.mean(np.abs(pred - true)))
    return PredictorQuality(kendall_tau=tau, mae_tokens=mae, num_pairs=int(pred.size))
