"""Counting the calls other processes make on a threaded actor (``summary()['cu_calls']``): the
control plane's CPU goes with the number of Ray calls, so their count per method is its breakdown."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class CountsCalls(Protocol):
    calls: Counter[str]
    _lock: threading.RLock


S = TypeVar("S", bound=CountsCalls)


def counted(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """``self.calls[method name] += 1`` under ``self._lock`` on every call, then the method."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            self.calls[name] += 1
        return method(self, *args, **kwargs)

    return wrapper
