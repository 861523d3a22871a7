"""``asp_config``: the offline length-aware scheduler (predict, DP minibatches, SA ordering)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mindspeed_rl.config_cls.fields import opt, section

PredictorType = Literal["oracle_noisy", "file", "text_features", "lm", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictorConfig:
    """Which length predictor, and its inputs.

    - oracle_noisy: measured lengths x exp(nu * N(0,1)), nu set to reach ``target_tau``
      (controlled-quality predictions as in the paper's ablation); lengths from ``path`` or from a
      builtin task that knows them.
    - file: predictions read from ``path`` (JSONL prompt-length pairs).
    - text_features: fast regressor trained on the prompt-length pairs in ``path``.
    - lm: HF sequence-regression model at ``model_path`` (trained on pairs in ``path``).
    - none: no prediction; minibatches keep dataset order (condition C0).
    """

    type: PredictorType = opt("none", "Predictor kind (see class doc).")
    path: str | None = opt(None, "Lengths / prompt-length pairs file (JSONL).")
    model_path: str | None = opt(None, "lm: HF folder of the regression model.")
    target_tau: float = opt(0.64, "oracle_noisy: Kendall tau to reach when calibrate_nu is true.")
    calibrate_nu: bool = opt(True, "oracle_noisy: search nu to hit target_tau (else use noise_sigma).")
    noise_sigma: float = opt(0.5, "oracle_noisy: nu used directly when calibrate_nu is false.")


@dataclass(frozen=True, slots=True, kw_only=True)
class ASPConfig:
    """Scheduler settings; read only by the async pipeline (inert in hybrid).

    Sizes are in PROMPTS. Defaults are the paper's (b=32, kappa=2, k=6, 2e6 SA steps, C=1).
    """

    predictor: PredictorConfig = section(PredictorConfig, "Length predictor.")
    b: int = opt(32, "Base minibatch size (prompts per generation actor job).")
    kappa: int = opt(2, "Minibatch sizes may vary in [b, b + kappa].")
    k: int = opt(6, "Minibatches per batch group (SA balances group loads).")
    sa_iterations: int = opt(2_000_000, "Simulated-annealing iterations (n_max).")
    sa_constant: float = opt(1.0, "SA temperature constant C in T_n = C / log(n + 2).")
    seed: int = opt(0, "Seed of the noisy oracle, SA and group shuffling.")
    shuffle_groups: bool = opt(True, "Shuffle whole batch groups after ordering (keeps their balance).")
    calibrate_loads: bool = opt(
        False,
        "Balance batch groups on isotonic-calibrated loads E[measured | predicted], fitted on profiled "
        "(prediction, length) pairs; oracle_noisy fits it on a random 20% of the true lengths.",
    )
    schedule_path: str | None = opt(
        None, "Precomputed schedule file; when set, prediction and SA are skipped."
    )
