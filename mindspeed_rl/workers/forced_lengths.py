"""Trace replay's forced response lengths: what each sample of a prompt must decode to.

A replay forces every sample to a length (EOS ignored) so the engine does the decode work a
trace implies. A plain trace gives fixed lengths (:class:`FixedLengths`); a replay under length
drift gives lengths that depend on the weights generating them (``policy_version``), as a
learning policy's would (``mindspeed_rl.sim.drift_replay``). Both are a :class:`LengthPlan`,
shipped to every generation actor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class LengthPlan(Protocol):
    def lengths(self, prompt_id: str, policy_version: int) -> tuple[int, ...]:
        """The response length of each of the prompt's samples, generated at ``policy_version``."""
        ...


@dataclass(frozen=True, slots=True)
class FixedLengths:
    per_prompt: Mapping[str, tuple[int, ...]]

    def lengths(self, prompt_id: str, policy_version: int) -> tuple[int, ...]:
        found = self.per_prompt.get(prompt_id)
        if found is None:
            raise ValueError(f"no forced lengths for prompt {prompt_id!r}; add it to the replay trace")
        return found


def as_length_plan(forced: Mapping[str, Sequence[int]] | LengthPlan, n: int) -> LengthPlan:
    """A mapping is checked (``n`` lengths per prompt, each >= 1) and fixed; a plan is kept."""
    if isinstance(forced, LengthPlan):
        return forced
    out: dict[str, tuple[int, ...]] = {}
    for pid, lengths in forced.items():
        out[pid] = check_lengths(pid, lengths, n)
    return FixedLengths(out)


def check_lengths(prompt_id: str, lengths: Sequence[int], n: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in lengths)
    if len(values) != n or min(values, default=0) < 1:
        raise ValueError(
            f"forced lengths of prompt {prompt_id} are {values}; give n_samples_per_prompt={n} lengths, each >= 1"
        )
    return values
