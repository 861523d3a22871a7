"""Starvation figures: how long each prompt waited, by its true length, and what got trained.

A prompt's wait runs from its first possible dispatch (when it entered the schedule: the run's
start for a whole-run schedule) to the trainer step that consumed it. Grouped by quintile of the
true lengths (the mean over the prompt's samples), a scheduler or a re-queue rule that pushes long
prompts back shows as a longest quintile that waits longer than the shortest. The trained-length
distribution is set against the distribution of every generated prompt's length (the data as the
policy answers it), so a pipeline that trains on short answers preferentially shows too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mindspeed_rl.runtime.records import CompletedMinibatch, GlobalBatch

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


class StarvationTracker:
    def __init__(self) -> None:
        self._available: dict[str, float] = {}
        self._length: dict[str, float] = {}
        self._rows: list[tuple[float, float, int]] = []  # (true length, wait s, step)

    def on_available(self, prompt_ids: Sequence[str], now: float) -> None:
        """Prompts entered the schedule (the first time counts)."""
        for p in prompt_ids:
            self._available.setdefault(p, now)

    def on_generated(self, completed: CompletedMinibatch) -> None:
        lengths: dict[str, list[int]] = {}
        for s in completed.samples:
            lengths.setdefault(s.prompt_id, []).append(len(s.response_token_ids))
        for p, values in lengths.items():
            self._length[p] = float(np.mean(values))

    def on_consumed(self, batch: GlobalBatch, now: float) -> None:
        for p in batch.prompt_ids:
            start = self._available.get(p, now)
            self._rows.append((self._length.get(p, 0.0), now - start, batch.step))

    def summary(self) -> dict[str, Any]:
        if not self._rows:
            return {"num_prompts": 0}
        arr = np.asarray(self._rows, dtype=np.float64)
        length, wait, step = arr[:, 0], arr[:, 1], arr[:, 2]
        order = np.argsort(length, kind="stable")
        quintiles = []
        for q, idx in enumerate(np.array_split(order, 5)):
            if idx.size == 0:
                continue
            quintiles.append(
                {
                    "quintile": q + 1,
                    "num_prompts": int(idx.size),
                    "length_min": float(length[idx].min()),
                    "length_max": float(length[idx].max()),
                    "wait_s_mean": float(wait[idx].mean()),
                    "wait_s_max": float(wait[idx].max()),
                    "wait_steps_mean": float(step[idx].mean()),
                    "wait_steps_max": int(step[idx].max()),
                }
            )
        generated = np.asarray(list(self._length.values()), dtype=np.float64)
        shortest, longest = quintiles[0]["wait_s_mean"], quintiles[-1]["wait_s_mean"]
        return {
            "num_prompts": int(length.size),
            "by_length_quintile": quintiles,
            "longest_to_shortest_mean_wait": longest / shortest if shortest > 0 else None,
            "trained_length": _distribution(length),
            "generated_length": _distribution(generated),
        }


def _distribution(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean())}
    out.update({f"p{int(q * 100)}": float(np.quantile(values, q)) for q in QUANTILES})
    return out
