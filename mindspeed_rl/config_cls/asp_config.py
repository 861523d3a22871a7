"""``asp_config``: the length-aware scheduler (predict, DP minibatches, SA ordering), offline or
online (``online: true``: predictions refit on the run's lengths, the unsent tail re-planned)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mindspeed_rl.config_cls.fields import opt, section

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams
    from asp_scheduler.predictors.factory import PredictorSpec

PredictorType = Literal["oracle_noisy", "file", "text_features", "lm", "none"]
DpObjective = Literal["utilization", "padded_slots"]


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

    def predictor_spec(self, *, seed: int, profiled_fraction: float) -> PredictorSpec:
        """The scheduler-side spec; ``none`` has none (the run keeps dataset order instead)."""
        # Imported here: config_cls must stay importable without numba/scipy.
        from asp_scheduler.predictors.factory import PredictorSpec

        if self.type == "none":
            raise ValueError("predictor.type none predicts nothing; choose a predictor to get a spec")
        return PredictorSpec(
            type=self.type,
            path=self.path,
            model_path=self.model_path,
            target_tau=self.target_tau,
            calibrate_nu=self.calibrate_nu,
            noise_sigma=self.noise_sigma,
            seed=seed,
            profiled_fraction=profiled_fraction,
        )


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
        "(prediction, length) pairs; oracle_noisy fits it on a random calibration_fraction of the true lengths.",
    )
    calibration_fraction: float = opt(
        0.2,
        "Share of prompts profiled for calibration (oracle_noisy) or held out to score text_features.",
    )
    dp_objective: DpObjective = opt(
        "utilization", "Algorithm 1 objective: utilization (the paper's sum of R) or padded_slots."
    )
    normalize: bool = opt(False, "Divide loads by their mean before SA (makes sa_constant relative).")
    allow_small: bool = opt(False, "Accept fewer than b prompts as one short minibatch.")
    schedule_path: str | None = opt(
        None, "Precomputed schedule file; when set, prediction and SA are skipped."
    )
    online: bool = opt(
        False,
        "Online ASP (async pipeline): every completed prompt's length feeds the predictor (per-prompt "
        "history, PAVA calibration refit over a recency window) and the not-yet-dispatched schedule "
        "is re-planned (DP + SA) from the refreshed predictions.",
    )
    refit_interval: int = opt(1, "online: trainer steps between calibration refits (>= 1).")
    replan_interval: int = opt(1, "online: trainer steps between re-plans of the unsent tail (>= 1).")
    recency_window: int = opt(256, "online: latest (prediction, length) pairs each refit fits (>= 8).")
    window: int | None = opt(
        None,
        "Streaming (async pipeline): schedule only the next W global batches, drawing prompts from "
        "the source as the window drains (null: the whole run's prompts scheduled up front).",
    )

    def schedule_params(self) -> ScheduleParams:
        """These settings as the scheduler's one parameter record (validated there)."""
        # Imported here: config_cls must stay importable without numba/scipy.
        from asp_scheduler.params import ScheduleParams

        return ScheduleParams(
            b=self.b,
            kappa=self.kappa,
            k=self.k,
            sa_iterations=self.sa_iterations,
            sa_constant=self.sa_constant,
            seed=self.seed,
            shuffle_groups=self.shuffle_groups,
            calibrate_loads=self.calibrate_loads,
            calibration_fraction=self.calibration_fraction,
            dp_objective=self.dp_objective,
            normalize=self.normalize,
            allow_small=self.allow_small,
        )

    def check_online(self) -> None:
        """The online keys' ranges, with the fix named (the trainer calls it before the run)."""
        for name, low in (("refit_interval", 1), ("replan_interval", 1), ("recency_window", 8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"asp_config.{name} must be an integer >= {low}, got {value!r}")

    def predictor_spec(self) -> PredictorSpec:
        """``predictor`` with this section's seed and profiled share."""
        return self.predictor.predictor_spec(seed=self.seed, profiled_fraction=self.calibration_fraction)
