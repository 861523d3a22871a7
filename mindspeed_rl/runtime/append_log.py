"""An append-only log with absolute positions that forgets what every reader has read.

A long run's Control Unit appends per minibatch and per step (arrivals, lag records, events);
kept whole, those lists grow with the run. Readers instead keep a cursor (an absolute position),
read ``since(cursor)``, and the owner calls ``trim(cursor)`` once all readers are past it, so
memory holds about one trainer step of entries. ``len`` keeps counting every entry ever appended.
An owner that never trims (the simulator: one in-process run) keeps the whole history.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class AppendLog(Generic[T]):
    def __init__(self) -> None:
        self._items: list[T] = []
        self._offset = 0  # absolute position of self._items[0]

    def append(self, item: T) -> None:
        self._items.append(item)

    def __len__(self) -> int:
        return self._offset + len(self._items)

    def __iter__(self) -> Iterator[T]:
        """The entries still held (all of them unless ``trim`` dropped some)."""
        return iter(self._items)

    def since(self, index: int) -> list[T]:
        """Entries appended at or after absolute position ``index``."""
        if index < self._offset:
            raise ValueError(f"entries before position {self._offset} were trimmed; asked from {index}")
        return self._items[index - self._offset :]

    def trim(self, before: int) -> None:
        """Forget the entries before absolute position ``before``."""
        cut = before - self._offset
        if cut > 0:
            del self._items[:cut]
            self._offset += cut
