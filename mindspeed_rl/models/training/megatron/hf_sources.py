"""Where the HF weights a rank loads come from: a :class:`TensorSource` reads one HF tensor, or
one contiguous range of it along a dim, so a rank reads only the rows/columns of its shard.

:class:`SafetensorsSource` slices an HF folder's ``*.safetensors`` files on disk (the engines'
load); :class:`DictSource` does the same over in-memory tensors (tests, conversions).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import torch


class TensorSource(Protocol):
    """Read-only access to HF tensors, optionally one contiguous range along a dim."""

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor: ...


class DictSource:
    """A :class:`TensorSource` over in-memory tensors (an HF ``state_dict``)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor:
        if name not in self._tensors:
            raise KeyError(f"{name} is not in the HF weights")
        t = self._tensors[name]
        end = t.shape[dim] if stop is None else stop
        return t.narrow(dim, start, end - start).clone()


class SafetensorsSource:
    """A :class:`TensorSource` over an HF folder: only the requested slice is read from disk."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        from safetensors import safe_open

        folder = Path(model_dir)
        self._files: dict[str, Path] = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    self._files[key] = file
        if not self._files:
            raise ValueError(f"{folder} holds no *.safetensors files; point the model path at an HF folder")

    def read(self, name: str, *, dim: int = 0, start: int = 0, stop: int | None = None) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self._files:
            raise KeyError(f"{name} is not in the HF weights")
        with safe_open(str(self._files[name]), framework="pt") as handle:
            piece = handle.get_slice(name)
            shape = piece.get_shape()
            end = shape[dim] if stop is None else stop
            index = tuple(slice(start, end) if d == dim else slice(None) for d in range(len(shape)))
            return piece[index].clone()
