"""Build the run's ASP schedule (the minibatches the Control Unit dispatches) from ``asp_config``.

Predictor types (``asp_config.predictor.type``):

* ``none`` -- condition C0: consecutive minibatches of ``b`` prompts in dataset order, no SA. No
  length information exists, so every predicted length and load is 0.0.
* ``oracle_noisy`` -- measured lengths blurred to a Kendall tau (the paper's ablation protocol).
  Measured lengths come from ``predictor.path`` (JSONL ``prompt_id`` -> ``length``) or from the
  ``true_lengths`` argument (built-in tasks that know them), never both.
* ``file`` -- ``FilePredictor`` on ``predictor.path`` (``prompt_id`` -> ``predicted_length``).
* ``text_features`` -- ridge regressor fitted on profiled pairs (``profiled_pairs`` argument or the
  pairs file ``predictor.path``: ``prompt_id``, ``length`` and optionally ``prompt`` text; rows
  without text take it from the prompt record with that id). Quality is measured on a held-out
  20% of the pairs' prompt ids; the final model is refitted on all pairs.
* ``lm`` -- a saved ``LMRegressor`` at ``predictor.model_path``; pairs, when given, only score it
  and feed calibration (they may overlap its training data, so that quality can be optimistic).

``asp_config.calibrate_loads`` balances batch groups on isotonic-calibrated loads. It needs
profiled (prediction, measured) pairs that the predictor did not train on: for the oracle a
random 20% of the prompts (as in the ablation), for ``text_features`` the held-out split (its
calibrator therefore maps the train-split model's outputs, a small mismatch with the refitted
model), for ``file``/``lm`` the given pairs.

Minibatch sizes lie in ``[b, b + kappa]``, except that at most one minibatch is shorter when the
prompt count cannot be split that way (C0: when ``b`` does not divide it). ``schedule_path`` loads
a saved schedule instead, which must list exactly the given prompt ids and match ``b`` and ``k``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asp_scheduler.calibration import IsotonicCalibrator
from asp_scheduler.jsonl import read_length_pairs
from asp_scheduler.predictors.base import PredictorQuality, PromptItem, evaluate_predictor
from asp_scheduler.predictors.from_file import FilePredictor, load_predictions
from asp_scheduler.predictors.holdout import split_by_prompt
from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions, noisy_oracle_with_nu
from asp_scheduler.predictors.text_features import TextFeaturePredictor
from asp_scheduler.schedule import Schedule, build_schedule, fixed_order_schedule
from mindspeed_rl.config_cls.asp_config import ASPConfig
from mindspeed_rl.datasets.records import PromptRecord
from mindspeed_rl.runtime.records import ScheduledMinibatch

CALIBRATION_FRACTION = 0.2
"""Share of prompts (oracle) or of pair prompt ids (text_features) profiled for calibration."""
_SHOWN_IDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSchedule:
    """The saved-able scheduler artifact plus the runtime's view of it (dispatch order)."""

    schedule: Schedule
    minibatches: tuple[ScheduledMinibatch, ...]
    predictor_quality: PredictorQuality | None

    @property
    def num_prompts(self) -> int:
        return sum(m.num_prompts for m in self.minibatches)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Predictions:
    lengths: np.ndarray
    quality: PredictorQuality | None
    provenance: dict[str, Any]
    profiled: tuple[np.ndarray, np.ndarray] | None = field(default=None)
    """(predicted, measured) pairs the predictor did not train on, for load calibration."""


def build_run_schedule(
    asp_config: ASPConfig,
    prompt_records: Sequence[PromptRecord],
    *,
    true_lengths: Mapping[str, float] | None = None,
    profiled_pairs: Sequence[tuple[PromptItem, float]] | None = None,
) -> RunSchedule:
    """Schedule every prompt of ``prompt_records`` once; see the module docstring."""
    items = _prompt_items(prompt_records)
    ids = [item.prompt_id for item in items]
    if asp_config.schedule_path:
        schedule = _load_checked(asp_config, ids)
    elif asp_config.predictor.type == "none":
        _check_count(asp_config, len(items))
        if asp_config.calibrate_loads:
            raise ValueError(
                "asp_config.calibrate_loads needs predicted lengths but predictor.type is 'none'; "
                "choose a predictor or set calibrate_loads: false"
            )
        schedule = fixed_order_schedule(
            np.zeros(len(items)), asp_config.b, asp_config.k, item_ids=ids, predictor={"name": "none"}
        )
    else:
        _check_count(asp_config, len(items))
        preds = _predict(asp_config, items, true_lengths, profiled_pairs)
        schedule = build_schedule(
            preds.lengths, asp_config.b, asp_config.kappa, asp_config.k, asp_config.sa_iterations,
            asp_config.sa_constant, asp_config.seed,
            calibrated_lengths=_calibrated(asp_config, preds), item_ids=ids,
            shuffle_groups=asp_config.shuffle_groups, predictor=preds.provenance,
            predictor_quality=preds.quality,
        )  # fmt: skip
    return RunSchedule(
        schedule=schedule,
        minibatches=scheduled_minibatches(schedule),
        predictor_quality=schedule.predictor_quality,
    )


def scheduled_minibatches(schedule: Schedule) -> tuple[ScheduledMinibatch, ...]:
    """The runtime records of ``schedule``, in dispatch order (``order_index`` = position)."""
    if schedule.item_ids is None:
        raise ValueError("the schedule has no prompt ids; build it with item_ids=<prompt ids>")
    item_ids = schedule.item_ids
    loads = schedule.predicted_loads
    return tuple(
        ScheduledMinibatch(
            minibatch_id=position,
            prompt_ids=tuple(item_ids[i] for i in members),
            batch_group_id=int(group),
            predicted_load=float(loads[position]),
            order_index=position,
        )
        for position, (members, group) in enumerate(zip(schedule.minibatches, schedule.batch_group_ids))
    )


def _prompt_items(records: Sequence[PromptRecord]) -> list[PromptItem]:
    if len(records) == 0:
        raise ValueError("no prompts to schedule; load at least asp_config.b prompts first")
    items = [PromptItem(prompt_id=r.prompt_id, text=r.text) for r in records]
    seen: set[str] = set()
    for item in items:
        if item.prompt_id in seen:
            raise ValueError(
                f"prompt id {item.prompt_id!r} occurs twice; every prompt is scheduled once, so ids must "
                "be unique (fix the dataset's id column)"
            )
        seen.add(item.prompt_id)
    return items


def _check_count(cfg: ASPConfig, num_prompts: int) -> None:
    if num_prompts < cfg.b:
        raise ValueError(
            f"only {num_prompts} prompts but asp_config.b={cfg.b} prompts per minibatch; lower asp_config.b "
            "or load more prompts"
        )


def _shown(ids: Sequence[str]) -> str:
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    return ", ".join(repr(i) for i in ids[:_SHOWN_IDS]) + more


def _load_checked(cfg: ASPConfig, ids: Sequence[str]) -> Schedule:
    path = Path(str(cfg.schedule_path))
    if not path.is_file():
        raise ValueError(
            f"asp_config.schedule_path={str(path)!r} does not exist; write it with "
            "`python -m asp_scheduler schedule` or unset schedule_path to build the schedule now"
        )
    schedule = Schedule.load(path)
    if schedule.item_ids is None:
        raise ValueError(f"{path} lists no prompt ids; rebuild it with prompt ids (schedule --prompts ...)")
    listed = [schedule.item_ids[i] for m in schedule.minibatches for i in m]
    wanted = set(ids)
    missing = sorted(wanted - set(listed))
    extra = sorted(set(listed) - wanted)
    if missing or extra or len(listed) != len(ids):
        raise ValueError(
            f"{path} does not cover exactly this run's {len(ids)} prompts (it lists {len(listed)} slots; "
            f"run prompts it lacks: {_shown(missing) or 'none'}; prompts not in this run: {_shown(extra) or 'none'}); "
            "rebuild the schedule "
            "for this prompt set or unset asp_config.schedule_path"
        )
    if (schedule.params.b, schedule.params.k) != (cfg.b, cfg.k):
        raise ValueError(
            f"{path} was built with b={schedule.params.b}, k={schedule.params.k} but asp_config has "
            f"b={cfg.b}, k={cfg.k}; set them to the schedule's values or rebuild the schedule"
        )
    return schedule


def _predict(
    cfg: ASPConfig,
    items: list[PromptItem],
    true_lengths: Mapping[str, float] | None,
    profiled_pairs: Sequence[tuple[PromptItem, float]] | None,
) -> _Predictions:
    kind = cfg.predictor.type
    if kind == "oracle_noisy":
        return _oracle(cfg, items, true_lengths)
    if true_lengths is not None:
        raise ValueError(
            f"true_lengths were passed but predictor.type is {kind!r}; only oracle_noisy uses measured lengths"
        )
    if kind == "file":
        if not cfg.predictor.path:
            raise ValueError(
                "predictor.type file needs asp_config.predictor.path (JSONL prompt_id -> predicted_length)"
            )
        predictor = FilePredictor(cfg.predictor.path)
        pairs = _pairs(None, profiled_pairs, items)
        return _scored(
            predictor.predict(items), predictor.predict, pairs, {"name": "file", "path": cfg.predictor.path}
        )
    if kind == "text_features":
        return _text_features(cfg, items, _require_pairs(cfg, profiled_pairs, items))
    if kind == "lm":
        return _lm(cfg, items, _pairs(cfg.predictor.path, profiled_pairs, items))
    raise ValueError(
        f"unknown asp_config.predictor.type {kind!r}; use none, oracle_noisy, file, text_features or lm"
    )


def _oracle(
    cfg: ASPConfig, items: list[PromptItem], true_lengths: Mapping[str, float] | None
) -> _Predictions:
    pred_cfg = cfg.predictor
    if (pred_cfg.path is None) == (true_lengths is None):
        raise ValueError(
            "predictor.type oracle_noisy needs measured lengths from exactly one source: set "
            "asp_config.predictor.path (JSONL prompt_id -> length) or pass true_lengths, not both/neither"
        )
    table = (
        true_lengths
        if true_lengths is not None
        else load_predictions(str(pred_cfg.path), length_field="length")
    )
    missing = [i.prompt_id for i in items if i.prompt_id not in table]
    if missing:
        raise ValueError(
            f"no measured length for {len(missing)} of {len(items)} prompts ({_shown(missing)}); "
            "the oracle needs one per prompt - complete the lengths file or pass them all"
        )
    truth = np.asarray([float(table[i.prompt_id]) for i in items], dtype=np.float64)
    if pred_cfg.calibrate_nu:
        result = noisy_oracle_predictions(truth, pred_cfg.target_tau, cfg.seed)
    else:
        result = noisy_oracle_with_nu(truth, pred_cfg.noise_sigma, cfg.seed)
    pred = result.predictions
    count = min(max(2, round(CALIBRATION_FRACTION * truth.size)), truth.size)
    profiled = np.random.default_rng([cfg.seed, 2]).choice(truth.size, size=count, replace=False)
    provenance = {
        "name": "noisy_oracle", "target_tau": pred_cfg.target_tau, "calibrate_nu": pred_cfg.calibrate_nu,
        "nu": result.nu, "seed": cfg.seed, "lengths_from": pred_cfg.path or "true_lengths argument",
    }  # fmt: skip
    return _Predictions(
        lengths=pred,
        quality=evaluate_predictor(pred, truth),
        provenance=provenance,
        profiled=(pred[profiled], truth[profiled]),
    )


def _pairs(
    path: str | None, given: Sequence[tuple[PromptItem, float]] | None, items: list[PromptItem]
) -> tuple[list[PromptItem], np.ndarray] | None:
    if path is not None and given is not None:
        raise ValueError(
            f"profiled pairs come from both predictor.path ({path}) and the profiled_pairs argument; "
            "use one source (unset predictor.path or pass no pairs)"
        )
    if given is not None:
        if len(given) == 0:
            raise ValueError("profiled_pairs is empty; pass (prompt, measured length) pairs or None")
        return [p for p, _ in given], np.asarray([float(v) for _, v in given], dtype=np.float64)
    if path is None:
        return None
    texts = {i.prompt_id: i.text for i in items}
    prompts: list[PromptItem] = []
    for pid, text, _ in (rows := read_length_pairs(path)):
        if text is None and pid not in texts:
            raise ValueError(
                f"{path}: pair for prompt {pid!r} has no 'prompt' text and the id is not in the prompt set; "
                "add the prompt text to the row"
            )
        prompts.append(PromptItem(prompt_id=pid, text=texts[pid] if text is None else text))
    return prompts, np.asarray([length for _, _, length in rows], dtype=np.float64)


def _require_pairs(
    cfg: ASPConfig, given: Sequence[tuple[PromptItem, float]] | None, items: list[PromptItem]
) -> tuple[list[PromptItem], np.ndarray]:
    pairs = _pairs(cfg.predictor.path, given, items)
    if pairs is None:
        raise ValueError(
            "predictor.type text_features is trained on profiled pairs: set asp_config.predictor.path to a "
            "JSONL of {prompt_id, length, prompt} rows or pass profiled_pairs"
        )
    return pairs


def _scored(
    lengths: np.ndarray,
    predict: Any,
    pairs: tuple[list[PromptItem], np.ndarray] | None,
    provenance: dict[str, Any],
) -> _Predictions:
    if pairs is None:
        return _Predictions(lengths=lengths, quality=None, provenance=provenance)
    pair_pred = np.asarray(predict(pairs[0]), dtype=np.float64)
    return _Predictions(
        lengths=lengths,
        quality=evaluate_predictor(pair_pred, pairs[1]),
        provenance={**provenance, "quality_on": f"{pairs[1].size} profiled pairs"},
        profiled=(pair_pred, pairs[1]),
    )


def _text_features(
    cfg: ASPConfig, items: list[PromptItem], pairs: tuple[list[PromptItem], np.ndarray]
) -> _Predictions:
    prompts, lengths = pairs
    train, test = split_by_prompt(prompts, holdout_fraction=CALIBRATION_FRACTION, seed=cfg.seed)
    model = TextFeaturePredictor().fit([prompts[i] for i in train], lengths[train])
    held_out = model.predict([prompts[i] for i in test])
    model.fit(prompts, lengths)
    provenance = {
        "name": "text_features", "pairs": len(prompts), "pairs_from": cfg.predictor.path or "profiled_pairs",
        "quality_on": f"{test.size} held-out pairs",
    }  # fmt: skip
    return _Predictions(
        lengths=model.predict(items),
        quality=evaluate_predictor(held_out, lengths[test]),
        provenance=provenance,
        profiled=(held_out, lengths[test]),
    )


def _lm(
    cfg: ASPConfig, items: list[PromptItem], pairs: tuple[list[PromptItem], np.ndarray] | None
) -> _Predictions:
    if not cfg.predictor.model_path:
        raise ValueError(
            "predictor.type lm needs asp_config.predictor.model_path (a folder from LMRegressor.save)"
        )
    from asp_scheduler.predictors.lm_regressor import LMRegressor

    model = LMRegressor.load(cfg.predictor.model_path)
    provenance = {"name": "lm_regressor", "model_path": cfg.predictor.model_path}
    return _scored(model.predict(items), model.predict, pairs, provenance)


def _calibrated(cfg: ASPConfig, preds: _Predictions) -> np.ndarray | None:
    if not cfg.calibrate_loads:
        return None
    if preds.profiled is None:
        raise ValueError(
            f"asp_config.calibrate_loads needs profiled (prediction, length) pairs, and predictor "
            f"{cfg.predictor.type!r} got none; pass profiled_pairs or set calibrate_loads: false"
        )
    return IsotonicCalibrator.fit(*preds.profiled).transform(preds.lengths)
