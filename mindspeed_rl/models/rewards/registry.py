"""Verifier registry: upstream's ``verifier_function`` / ``verifier_weight`` pair -> one reward fn.

A verifier is any ``(response, label) -> float``; a tool-aware one (``retool_reward``) also reads
each multi-turn sample's ToolRecord (its own text and tool rounds) when the caller passes them.
The run plan checks the names (``check_verifier_names``), so a typo fails in ``check_config`` with
the nearest known name instead of upstream's silent skip, and an upstream name whose meaning this
framework does not have fails naming that feature. The ``demo`` verifier lives with the demo task and is imported only when requested.

Bounded and unbounded verifiers: the format, maze and demo checks are linear-time string scans
that cannot hang, and the demo one runs ~500 times an iteration in microseconds; they run in the
calling process (sending them to a worker would cost more than running them). Math verifiers
(sympy) and every verifier registered at run time are unbounded: they run in the worker pool
(``pool.py``), which enforces ``verifier_timeout`` even with ``verifier_parallel == 1``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

import numpy as np

from mindspeed_rl.models.rewards import dapo_math, format_verifiers, math_verifiers, maze, retool
from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.models.rewards.pool import PoolScores, VerifierPool
from mindspeed_rl.models.rewards.retool import ToolRecord


class Verifier(Protocol):
    def __call__(self, response: str, label: str, /) -> float: ...


class ToolVerifier(Protocol):
    """A verifier that also reads the sample's tool use (multi-turn rollouts): it is given the
    model's own text (tool responses removed) and the number of tool rounds."""

    def __call__(self, response: str, label: str, tool_rounds: int, /) -> float: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    verifier: Verifier
    bounded: bool
    """True when the verifier provably finishes quickly (runs in-process, no timeout)."""
    warm_up: Callable[[], object] | None = None
    """Run once in the parent before the workers fork (imports, caches); see VerifierPool."""
    tool_verifier: ToolVerifier | None = None
    """Set for a tool-aware verifier (bounded only): RewardFunction calls it with each sample's
    ToolRecord when it has one; ``verifier`` is its single-turn form (whole text, no tool rounds)."""


_EAGER: dict[str, _Entry] = {
    "acc": _Entry(verifier=math_verifiers.acc, bounded=False, warm_up=math_verifiers.warm_up),
    "base_acc": _Entry(verifier=math_verifiers.base_acc, bounded=False, warm_up=math_verifiers.warm_up),
    "math_17k_acc": _Entry(
        verifier=math_verifiers.math_17k_acc, bounded=False, warm_up=math_verifiers.warm_up
    ),
    "math_verify_reward": _Entry(
        verifier=math_verifiers.math_verify_reward, bounded=False, warm_up=math_verifiers.warm_up
    ),
    # Upstream's PPO accuracy grades the last boxed answer 1/0 with the grader of its math_17k_acc:
    # the same check as ours under that name.
    "acc_for_ppo": _Entry(
        verifier=math_verifiers.math_17k_acc, bounded=False, warm_up=math_verifiers.warm_up
    ),
    # DAPO's signed scorer (+1 / -1); string work only, so in-process (dapo_math.py).
    "acc_for_dapo": _Entry(verifier=dapo_math.acc_for_dapo, bounded=True),
    "acc_for_dapo_strict_box": _Entry(verifier=dapo_math.acc_for_dapo_strict_box, bounded=True),
    "format": _Entry(verifier=format_verifiers.format_reward, bounded=True),
    "strict_format": _Entry(verifier=format_verifiers.strict_format_reward, bounded=True),
    "maze_integrity": _Entry(verifier=maze.maze_integrity, bounded=True),
    "maze_correct": _Entry(verifier=maze.maze_correct, bounded=True),
    # Upstream's ReTool scorer (multi-turn DAPO): strict box +1 / -1, +0.1 per tool round when wrong.
    "retool_reward": _Entry(verifier=retool.retool_reward, bounded=True, tool_verifier=retool.retool_reward),
}
# name -> (module, attribute, bounded): imported on first use so a missing optional module only
# matters to the configs that ask for it.
_LAZY: dict[str, tuple[str, str, bool]] = {
    "demo": ("mindspeed_rl.datasets.demo_task", "demo_reward", True),
    "demo_exact": ("mindspeed_rl.models.rewards.demo_exact", "demo_exact", True),
}


# Upstream names whose meaning this framework does not have: an error naming the feature, raised
# when the run plan is built (check_config), not at the first reward call.
_REFUSED: dict[str, str] = {}  # none at present (retool_reward is built: retool.py)


def known_verifiers() -> tuple[str, ...]:
    return tuple(sorted([*_EAGER, *_LAZY]))


def register_verifier(name: str, verifier: Verifier, *, bounded: bool = False) -> None:
    """Add a verifier under ``name``. Leave ``bounded`` False unless it cannot hang: unbounded
    verifiers run in worker processes so ``verifier_timeout`` can stop them."""
    if name in _EAGER or name in _LAZY:
        raise ValueError(f"verifier {name!r} is already registered; pick another name")
    _EAGER[name] = _Entry(verifier=verifier, bounded=bounded)


def unregister_verifier(name: str) -> None:
    if name not in _EAGER:
        raise ValueError(f"verifier {name!r} was not registered with register_verifier")
    del _EAGER[name]


def check_verifier_names(names: Sequence[str]) -> None:
    """ValueError for the first name that is not registered (naming the nearest known one) or that
    asks for a feature this framework does not have, without importing any verifier module."""
    for name in names:
        if name not in _EAGER and name not in _LAZY:
            _refuse(name)


def _entry(name: str) -> _Entry:
    if name in _EAGER:
        return _EAGER[name]
    if name in _LAZY:
        module_name, attr, bounded = _LAZY[name]
        return _Entry(verifier=getattr(importlib.import_module(module_name), attr), bounded=bounded)
    _refuse(name)


def _refuse(name: str) -> NoReturn:
    if name in _REFUSED:
        raise ValueError(f"rl_config.verifier_function: {name!r} {_REFUSED[name]}")
    known = known_verifiers()
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
    hint = f" Did you mean {nearest[0]!r}?" if nearest else ""
    raise ValueError(
        f"unknown verifier {name!r} in rl_config.verifier_function.{hint} Known verifiers: {', '.join(known)}."
    )


def get_verifier(name: str) -> Verifier:
    """The verifier registered under ``name``; ValueError naming the nearest known name if none."""
    return _entry(name).verifier


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardResult:
    """Per-sample rewards: ``rewards`` is the weighted sum, ``per_verifier`` the raw scores."""

    rewards: np.ndarray
    per_verifier: Mapping[str, np.ndarray]
    num_timed_out: int = 0
    """Responses whose verification exceeded ``verifier_timeout``; they score 0 on every verifier."""


class RewardFunction:
    """Weighted sum of verifiers, applied sample by sample (see the module docstring for where).

    Owns the worker processes of its unbounded verifiers: ``close()`` (or ``with``) stops them;
    garbage collection and interpreter exit do too.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        weights: tuple[float, ...],
        entries: tuple[_Entry, ...],
        *,
        parallel: int,
        timeout: float,
    ) -> None:
        self.names = names
        self.weights = weights
        # Tool records are applied in-process only (the pool sends (response, label) pairs).
        assert all(e.bounded for e in entries if e.tool_verifier is not None), "tool verifiers are bounded"
        self._in_process = tuple(i for i, e in enumerate(entries) if e.bounded)
        self._pooled = tuple(i for i, e in enumerate(entries) if not e.bounded)
        self._entries = entries
        pooled = [entries[i] for i in self._pooled]
        # One warm-up per distinct function: the math verifiers share theirs.
        warm_ups = list(dict.fromkeys(e.warm_up for e in pooled if e.warm_up is not None))
        self._pool = (
            VerifierPool(
                [e.verifier for e in pooled], num_workers=parallel, timeout=timeout, warm_ups=warm_ups
            )
            if pooled
            else None
        )

    def __call__(
        self,
        responses: Sequence[str],
        labels: Sequence[str],
        tool_records: Sequence[ToolRecord | None] | None = None,
    ) -> RewardResult:
        """``tool_records`` (multi-turn rollouts, one per response, None for a single-turn one):
        what tool-aware verifiers read instead of the whole text; the others score ``responses``."""
        if len(responses) != len(labels):
            raise ValueError(
                f"got {len(responses)} responses but {len(labels)} labels; pass one label per "
                "response (repeat each prompt's label n_samples_per_prompt times)"
            )
        if tool_records is not None and len(tool_records) != len(responses):
            raise ValueError(
                f"got {len(tool_records)} tool records for {len(responses)} responses; pass one per "
                "response (None for a response without tool use)"
            )
        scores = np.zeros((len(self.names), len(responses)), dtype=np.float64)
        for i in self._in_process:
            entry = self._entries[i]
            if entry.tool_verifier is not None and tool_records is not None:
                scores[i] = _score_with_tools(entry.tool_verifier, responses, labels, tool_records)
                continue
            verifier = entry.verifier
            scores[i] = np.fromiter(
                (float(verifier(r, lab)) for r, lab in zip(responses, labels)),
                dtype=np.float64,
                count=len(responses),
            )
        num_timed_out = 0
        if self._pool is not None:
            pooled: PoolScores = self._pool.score(list(zip(responses, labels)))
            scores[list(self._pooled)] = pooled.scores.T
            # A response that could not be verified earns nothing, format bonuses included.
            scores[:, pooled.timed_out] = 0.0
            num_timed_out = int(pooled.timed_out.sum())
        total = np.asarray(self.weights, dtype=np.float64) @ scores
        per_verifier = {name: scores[i] for i, name in enumerate(self.names)}
        return RewardResult(rewards=total, per_verifier=per_verifier, num_timed_out=num_timed_out)

    @property
    def max_reward(self) -> float:
        """The reward of a response every verifier gives full marks (1.0) to."""
        return float(sum(w for w in self.weights if w > 0))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardFunction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _score_with_tools(
    verifier: ToolVerifier,
    responses: Sequence[str],
    labels: Sequence[str],
    records: Sequence[ToolRecord | None],
) -> np.ndarray:
    # A response without a record (no tool use recorded) is scored on its whole text, no rounds.
    return np.fromiter(
        (
            float(verifier(r, lab, 0) if rec is None else verifier(rec.model_text, lab, rec.tool_rounds))
            for r, lab, rec in zip(responses, labels, records)
        ),
        dtype=np.float64,
        count=len(responses),
    )


def build_reward_fn(reward_config: RewardConfig) -> RewardFunction:
    """Resolve upstream's ``verifier_function`` / ``verifier_weight`` lists into a RewardFunction."""
    names_in: Sequence[str] = reward_config.verifier_function
    if isinstance(names_in, str):
        raise ValueError(
            f"verifier_function must be a list of names, got the string {names_in!r}; "
            f"write verifier_function: [{names_in!r}]"
        )
    names = tuple(names_in)
    weights = tuple(float(w) for w in reward_config.verifier_weight)
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
    if reward_config.verifier_parallel < 1:
        raise ValueError(
            f"rl_config.verifier_parallel={reward_config.verifier_parallel}; use 1 (one worker) or more"
        )
    if not reward_config.verifier_timeout > 0:
        raise ValueError(
            f"rl_config.verifier_timeout={reward_config.verifier_timeout}; use a positive number of seconds"
        )
    entries = tuple(_entry(name) for name in names)
    return RewardFunction(
        names,
        weights,
        entries,
        parallel=reward_config.verifier_parallel,
        timeout=reward_config.verifier_timeout,
    )
