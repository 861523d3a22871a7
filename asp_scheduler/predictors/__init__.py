"""Length predictors behind one interface (:class:`LengthPredictor`)."""

from asp_scheduler.predictors.base import (
    LengthPredictor,
    PredictorQuality,
    PromptItem,
    evaluate_predictor,
)
from asp_scheduler.predictors.noisy_oracle import NoisyOraclePredictor, noisy_oracle_predictions

__all__ = [
    "LengthPredictor",
    "NoisyOraclePredictor",
    "PredictorQuality",
    "PromptItem",
    "evaluate_predictor",
    "noisy_oracle_predictions",
]
