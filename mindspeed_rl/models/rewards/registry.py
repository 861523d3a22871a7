"""Verifier registry: upstream's ``verifier_function`` / ``verifier_weight`` pair -> one reward fn.

A verifier is any ``(response, label) -> float``. Names resolve eagerly when the reward function
is built, so a typo fails at start-up with the nearest known name instead of upstream's silent
skip. The ``demo`` verifier lives with the demo task and is imported only when requested.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mindspeed_rl.models.rewards import format_verifiers, math_verifiers, maze


class Verifier(Protocol):
    def __call__(self, response: str, label: str, /) -> float: ...


_EAGER: dict[str, Verifier] = {
    "acc": math_verifiers.acc,
    "base_acc": math_verifiers.base_acc,
    "math_17k_acc": math_verifiers.math_17k_acc,
    "math_verify_reward": math_verifiers.math_verify_reward,
    "format": format_verifiers.format_reward,
    "strict_format": format_verifiers.strict_format_reward,
    "maze_integrity": maze.maze_integrity,
    "maze_correct": maze.maze_correct,
}
# name -> (module, attribute): imported on first use so a missing optional module only matters
# to the configs that ask for it.
_LAZY: dict[str, tuple[str, str]] = {
    "demo": ("mindspeed_rl.datasets.demo_task", "demo_reward"),
}


def known_verifiers() -> tuple[str, ...]:
    return tuple(sorted([*_EAGER, *_LAZY]))


def get_verifier(name: str) -> Verifier:
    """The verifier registered under ``name``; ValueError naming the nearest known name if none."""
    if name in _EAGER:
        return _EAGER[name]
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        verifier: Verifier = getattr(importlib.import_module(module_name), attr)
        return verifier
    known = known_verifiers()
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
    hint = f" Did you mean {nearest[0]!r}?" if nearest else ""
    raise ValueError(
        f"unknown verifier {name!r} in rl_config.verifier_function.{hint} Known verifiers: {', '.join(known)}."
    )


@dataclass(frozen=True, slots=True)
class RewardResult:
    """Per-sample rewards: ``rewards`` is the weighted sum, ``per_verifier`` the raw scores."""

    rewards: np.ndarray
    per_verifier: Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class RewardFunction:
    """Weighted sum of verifiers, applied sample by sample."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    verifiers: tuple[Callable[[str, str], float], ...]

    def __call__(self, responses: Sequence[str], labels: Sequence[str]) -> RewardResult:
        if len(responses) != len(labels):
            raise ValueError(
                f"got {len(responses)} responses but {len(labels)} labels; pass one label per "
                "response (repeat each prompt's label n_samples_per_prompt times)"
            )
        per_verifier: dict[str, np.ndarray] = {}
        total = np.zeros(len(responses), dtype=np.float64)
        for name, weight, verifier in zip(self.names, self.weights, self.verifiers):
            scores = np.fromiter(
                (float(verifier(r, lab)) for r, lab in zip(responses, labels)),
                dtype=np.float64,
                count=len(responses),
            )
            per_verifier[name] = scores
            total += weight * scores
        return RewardResult(rewards=total, per_verifier=per_verifier)


def build_reward_fn(verifier_function: Sequence[str], verifier_weight: Sequence[float]) -> RewardFunction:
    """Resolve upstream's ``verifier_function`` / ``verifier_weight`` lists into a RewardFunction."""
    if isinstance(verifier_function, str):
        raise ValueError(
            f"verifier_function must be a list of names, got the string {verifier_function!r}; "
            f"write verifier_function: [{verifier_function!r}]"
        )
    names = tuple(verifier_function)
    weights = tuple(float(w) for w in verifier_weight)
    if not names:
        raise ValueError("verifier_function is empty; name at least one verifier, e.g. ['acc']")
    if len(names) != len(weights):
        raise ValueError(
            f"verifier_function has {len(names)} names {list(names)} but verifier_weight has "
            f"{len(weights)} values {list(weights)}; give exactly one weight per verifier"
        )
    if len(set(names)) != len(names):
        raise ValueError(
            f"verifier_function lists a verifier twice: {list(names)}; merge the weights instead"
        )
    if not all(np.isfinite(weights)):
        raise ValueError(f"verifier_weight must be finite numbers, got {list(weights)}")
    verifiers = tuple(get_verifier(name) for name in names)
    return RewardFunction(names=names, weights=weights, verifiers=verifiers)
