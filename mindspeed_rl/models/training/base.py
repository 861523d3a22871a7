"""The backend-neutral interface every training engine implements (torch and megatron-core).

Trainers and workers depend on this Protocol only; nothing here names torch.nn, HF or Megatron
types beyond the tensors handed to the rollout engine for a weight reload.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mindspeed_rl.models.rollout.weight_stream import WeightStream
    from mindspeed_rl.models.training.batch import TrainBatch


@runtime_checkable
class LogProbModel(Protocol):
    """Anything that scores response tokens: the policy and the frozen reference."""

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        """Per-sample float32 arrays of ``log_softmax(logits / temperature)`` at the response tokens."""
        ...


@runtime_checkable
class TrainingEngine(LogProbModel, Protocol):
    """The policy being trained."""

    def update(self, batch: TrainBatch, temperature: float) -> dict[str, float]:
        """Run ``epochs`` passes of mini-batch optimizer steps over ``batch``; return averaged metrics."""
        ...

    def named_weights_for_inference(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named, detached CPU tensors: what a rollout engine reloads in place."""
        ...

    def weight_stream(self) -> WeightStream:
        """The colocated push: the whole HF-named model on this rank's device, one tensor at a
        time, for the rollout engine in the same process (collective on a rank group)."""
        ...

    def save_hf(self, path: str | os.PathLike[str]) -> None:
        """Write an HF model folder (safetensors) that any rollout engine can start from."""
        ...

    def save_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """Write a resumable checkpoint into the folder ``path`` (an HF folder of the weights
        included, so a resumed run's rollout engines can start from it)."""
        ...

    def load_state(self, path: str | os.PathLike[str], *, optimizer: bool = True, rng: bool = True) -> None:
        """Continue from ``save_state``'s folder; ``optimizer`` / ``rng`` False keep fresh ones."""
        ...
