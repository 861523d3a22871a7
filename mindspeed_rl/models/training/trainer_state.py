"""The non-weight state of a training engine, as one file beside its HF weights.

``trainer_state.pt`` (torch.save, loadable with ``weights_only=True``)::

    format                1
    num_optimizer_steps   drives the LR schedule (a pure function of the step)
    num_updates           seeds the per-update mini-batch shuffle
    kl_coef               the adaptive KL controller's coefficient
    optimizer             the optimizer's state_dict, or None (no_save_optim)
    rng                   torch / CUDA / numpy / python RNG states, or None (no_save_rng)

The numpy state is stored as a tensor and the python state as plain tuples, so loading never
unpickles arbitrary objects.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

TRAINER_STATE_FILE = "trainer_state.pt"
FORMAT = 1


def capture_rng() -> dict[str, Any]:
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            np_kind,
            torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            np_pos,
            np_has_gauss,
            np_gauss,
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(_as_python_state(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(state: Any) -> tuple[Any, ...]:
    # torch.save round-trips tuples as tuples, but random.setstate insists on the inner tuple too.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def save_trainer_state(folder: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` and fsync it: the checkpoint's manifest, written after, vouches for it."""
    path = Path(folder) / TRAINER_STATE_FILE
    with path.open("wb") as handle:
        torch.save({"format": FORMAT, **state}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def load_trainer_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / TRAINER_STATE_FILE
    if not path.is_file():
        raise ValueError(
            f"{path} is missing: {folder} is not a resumable checkpoint (an HF folder only?); "
            "resume from a folder written with save_interval + actor_config.save, or use finetune: true "
            "to start from its weights"
        )
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} has format {state.get('format')!r}; this version reads format {FORMAT}")
    return state


def check_loadable(
    state: dict[str, Any], folder: str | os.PathLike[str], *, engine: str, optimizer: bool, rng: bool
) -> None:
    """Refuse, naming the key to change, a checkpoint ``engine`` ("torch" | "megatron") cannot
    continue: another engine's (the megatron engine records its ``layout``), or one saved without
    the optimizer / RNG state the run wants to load."""
    written_by = "megatron" if "layout" in state else "torch"
    if written_by != engine:
        raise ValueError(
            f"{folder} was written by the {written_by} engine; resume it with "
            f"megatron_training.use_mcore_models: {str(written_by == 'megatron').lower()}, or start the "
            f"{engine} engine from its HF weights with actor_config.finetune: true"
        )
    if optimizer and state["optimizer"] is None:
        raise ValueError(
            f"{folder} was saved without optimizer state (no_save_optim); set "
            "actor_config.no_load_optim: true to resume with fresh optimizer moments"
        )
    if rng and state["rng"] is None:
        raise ValueError(
            f"{folder} was saved without RNG state (no_save_rng); set actor_config.no_load_rng: true"
        )
