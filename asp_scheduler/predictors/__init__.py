"""Length predictors behind one interface (:class:`LengthPredictor`).

``LMRegressor`` is resolved on first attribute access: it is the only predictor that needs
torch/transformers, and ``import asp_scheduler.predictors`` must stay light on CPU-only hosts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asp_scheduler.predictors.base import (
    LengthPredictor,
    PredictorQuality,
    PromptItem,
    evaluate_predictor,
)
from asp_scheduler.predictors.factory import Predictions, PredictorSpec, predict_lengths
from asp_scheduler.predictors.from_file import FilePredictor
from asp_scheduler.predictors.holdout import group_by_prompt, holdout_quality, split_by_prompt
from asp_scheduler.predictors.noisy_oracle import NoisyOraclePredictor, noisy_oracle_predictions
from asp_scheduler.predictors.text_features import TextFeaturePredictor

if TYPE_CHECKING:
    from asp_scheduler.predictors.lm_regressor import LMRegressor

__all__ = [
    "FilePredictor",
    "LMRegressor",
    "LengthPredictor",
    "NoisyOraclePredictor",
    "PredictorQuality",
    "PredictorSpec",
    "Predictions",
    "PromptItem",
    "TextFeaturePredictor",
    "evaluate_predictor",
    "group_by_prompt",
    "holdout_quality",
    "noisy_oracle_predictions",
    "predict_lengths",
    "split_by_prompt",
]


def __getattr__(name: str) -> Any:
    if name == "LMRegressor":
        from asp_scheduler.predictors.lm_regressor import LMRegressor

        return LMRegressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
