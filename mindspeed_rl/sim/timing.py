"""Modeled durations: decode, train step, and the weight flow (save, convert, load).

Decode model. An actor decodes a minibatch's ``m · n`` sequences together and returns them only
when the longest one is done (the paper's minibatch semantics). With a per-step cost that grows
linearly with the number of still-active sequences, ``t_step(active) = a + b · active``, the
minibatch time telescopes to a closed form::

    T_gen = c + Σ_{s=1..L_max} (a + b · active(s)) = c + a · L_max + b · Σ_i L_i

because ``Σ_s active(s)`` counts every generated token once. ``a`` is what a long straggler costs
(each step of the longest response pays it whatever the batch), ``b`` what a token costs, ``c``
the prefill/launch overhead. ``python -m mindspeed_rl.sim fit-decode`` fits ``a, b, c`` from
measured engine runs. The model ignores a continuous-batching cap (``max_num_seqs``): minibatches
are far smaller than the engine's batch limit in the paper's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


def _check_non_negative(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{owner}.{name} must be a finite number >= 0 (seconds), got {value!r}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeModel:
    """``T_gen = per_minibatch + per_step · L_max + per_token · Σ L`` (seconds)."""

    per_step_seconds: float
    """``a``: fixed cost of one decode step, paid for every step up to the longest response."""
    per_token_seconds: float
    """``b``: extra cost per active sequence per step, i.e. per generated token."""
    per_minibatch_seconds: float = 0.0
    """``c``: prefill and launch overhead of one minibatch."""

    def __post_init__(self) -> None:
        _check_non_negative(
            "decode",
            per_step_seconds=self.per_step_seconds,
            per_token_seconds=self.per_token_seconds,
            per_minibatch_seconds=self.per_minibatch_seconds,
        )

    def step_seconds(self, num_active: int) -> float:
        """``t_step(active) = a + b · active``."""
        return self.per_step_seconds + self.per_token_seconds * num_active

    def minibatch_seconds(self, lengths: np.ndarray) -> float:
        """Decode time of one minibatch whose responses have these lengths (tokens)."""
        arr = np.asarray(lengths)
        if arr.size == 0:
            raise ValueError("a minibatch needs at least one response to time; got no lengths.")
        return float(
            self.per_minibatch_seconds
            + self.per_step_seconds * float(arr.max())
            + self.per_token_seconds * float(arr.sum())
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainModel:
    """``T_train = per_step + per_token · (response tokens in the global batch)`` (seconds)."""

    per_step_seconds: float
    per_token_seconds: float = 0.0

    def __post_init__(self) -> None:
        _check_non_negative(
            "train", per_step_seconds=self.per_step_seconds, per_token_seconds=self.per_token_seconds
        )
        if self.per_step_seconds + self.per_token_seconds <= 0:
            raise ValueError("train: a training step must take time; set per_step_seconds > 0.")

    def step_seconds(self, num_tokens: int) -> float:
        return self.per_step_seconds + self.per_token_seconds * num_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightFlowModel:
    """Durations of one snapshot's export (TU), conversion (once per GU) and reload (per actor)."""

    save_seconds: float
    convert_seconds: float
    load_seconds: float

    def __post_init__(self) -> None:
        _check_non_negative(
            "weight_flow",
            save_seconds=self.save_seconds,
            convert_seconds=self.convert_seconds,
            load_seconds=self.load_seconds,
        )

    @property
    def delay_seconds(self) -> float:
        """``T_save + T_convert + T_load``: a snapshot's trip from the TU into an actor."""
        return self.save_seconds + self.convert_seconds + self.load_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingProfile:
    """Everything the simulator needs to know about how long things take."""

    decode: DecodeModel
    train: TrainModel
    weight_flow: WeightFlowModel
    noise_cv: float = 0.0
    """Multiplicative log-normal jitter on every decode and train duration (0 = exact model);
    drawn from the simulation seed, so a run stays deterministic per seed."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise_cv < 1.0:
            raise ValueError(f"noise_cv must lie in [0, 1), got {self.noise_cv}; 0.05 is a mild jitter.")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TimingProfile:
        """Build from a YAML-style mapping with ``decode``, ``train``, ``weight_flow`` sections."""
        _reject_unknown("profile", data, {"decode", "train", "weight_flow", "noise_cv"})
        for section in ("decode", "train", "weight_flow"):
            if section not in data:
                raise ValueError(f"profile needs a '{section}' section; see configs/sim/qwen3_30b_a3b.yaml.")
        return cls(
            decode=_build(DecodeModel, "profile.decode", data["decode"]),
            train=_build(TrainModel, "profile.train", data["train"]),
            weight_flow=_build(WeightFlowModel, "profile.weight_flow", data["weight_flow"]),
            noise_cv=float(data.get("noise_cv", 0.0)),
        )


def _reject_unknown(where: str, data: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {sorted(known)}.")


def _build(cls: Any, where: str, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of field: value, got {type(data).__name__}.")
    _reject_unknown(where, data, {f.name for f in fields(cls)})
    return cls(**{k: float(v) for k, v in data.items()})
