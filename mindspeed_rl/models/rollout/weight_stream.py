"""HF-named weights that arrive one tensor at a time, with every name and shape known up front.

The colocated hybrid's push (``workers/colocated_rank.py``) produces each weight inside a
collective: the tensor exists on this rank's device only while the engine's loader copies it
into its own parameter. Materialising the update first (as a list or a ``HostWeights``) would
hold a second whole model on the device, exactly what colocation must avoid. The names and
shapes, fixed by the conversion plan before any byte moves, let the engine reject a partial or
misfit update before its first weight is touched.

Single use: iterating runs the collectives, which every rank must run once, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class WeightStream:
    """``(name, tensor)`` pairs from ``tensors``, announced by ``shapes`` (same names, same order)."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    tensors: Iterator[tuple[str, torch.Tensor]]
    _used: bool = field(default=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.shapes)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._used:
            raise RuntimeError(
                "a WeightStream is consumed once (its tensors come out of collectives every rank runs "
                "once); ask the trainer for a new one"
            )
        self._used = True
        return self._checked()

    def _checked(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The announced names and shapes, in order: a producer that strays is a bug, not an update."""
        announced = iter(self.shapes)
        for name, tensor in self.tensors:
            want = next(announced, None)
            if want is None or want != (name, tuple(tensor.shape)):
                raise RuntimeError(
                    f"weight stream sent {name}{list(tensor.shape)} where it announced "
                    f"{'nothing more' if want is None else f'{want[0]}{list(want[1])}'}"
                )
            yield name, tensor
        if (left := next(announced, None)) is not None:
            raise RuntimeError(f"weight stream ended before {left[0]}, which it announced")
