"""Which predictor a spec names, run on a prompt set: predictions, their quality and provenance.

Predictor types (``PredictorSpec.type``):

* ``oracle_noisy`` -- measured lengths blurred to a Kendall tau (the paper's ablation protocol).
  Measured lengths come from ``path`` (JSONL ``prompt_id`` -> ``length``) or from the
  ``true_lengths`` argument (tasks that know them), never both.
* ``file`` -- ``FilePredictor`` on ``path`` (``prompt_id`` -> ``predicted_length``).
* ``text_features`` -- ridge regressor fitted on profiled pairs (``profiled_pairs`` argument or the
  pairs file ``path``: ``prompt_id``, ``length`` and optionally ``prompt`` text; rows without text
  take it from the prompt with that id). Quality is measured on a held-out ``profiled_fraction``
  of the pairs' prompt ids; the final model is refitted on all pairs.
* ``lm`` -- a saved ``LMRegressor`` at ``model_path``; pairs, when given, only score it and feed
  calibration (they may overlap its training data, so that quality can be optimistic).

``Predictions.profiled`` holds (prediction, measured) pairs the predictor did not train on, which
is what load calibration needs: for the oracle a random ``profiled_fraction`` of the prompts (the
ablation's draw), for ``text_features`` the held-out split (its calibrator therefore maps the
train-split model's outputs, a small mismatch with the refitted model), for ``file``/``lm`` the
given pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from asp_scheduler.calibration import IsotonicCalibrator, profiled_indices
from asp_scheduler.jsonl import read_length_pairs
from asp_scheduler.predictors.base import PredictorQuality, PromptItem, evaluate_predictor
from asp_scheduler.predictors.from_file import FilePredictor, load_predictions
from asp_scheduler.predictors.holdout import split_by_prompt
from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions, noisy_oracle_with_nu
from asp_scheduler.predictors.text_features import TextFeaturePredictor

PredictorKind = Literal["oracle_noisy", "file", "text_features", "lm"]
_SHOWN_IDS = 5
_Pairs = tuple[list[PromptItem], np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictorSpec:
    """One predictor and its inputs (``asp_config.predictor`` converts to this)."""

    type: PredictorKind
    """Which predictor; see the module docstring."""
    path: str | None = None
    """Lengths (oracle), predictions (file) or prompt-length pairs (text_features, lm) JSONL."""
    model_path: str | None = None
    """lm: folder written by ``LMRegressor.save``."""
    target_tau: float = 0.64
    """oracle_noisy: Kendall tau to reach when ``calibrate_nu`` is true."""
    calibrate_nu: bool = True
    """oracle_noisy: search the noise nu to hit ``target_tau`` (else use ``noise_sigma``)."""
    noise_sigma: float = 0.5
    """oracle_noisy: nu used directly when ``calibrate_nu`` is false."""
    seed: int = 0
    """Seed of the oracle's noise, its profiled subset and the text_features holdout split."""
    profiled_fraction: float = 0.2
    """Share of prompts (oracle) or pair prompt ids (text_features) profiled / held out."""

    def __post_init__(self) -> None:
        if self.type not in get_args(PredictorKind):
            raise ValueError(
                f"unknown predictor type {self.type!r}; use one of {list(get_args(PredictorKind))} "
                "(or none for dataset order, which predicts nothing)"
            )
        if not 0.0 < self.profiled_fraction < 1.0:
            raise ValueError(f"profiled_fraction must be in (0, 1), got {self.profiled_fraction!r}; e.g. 0.2")


@dataclass(frozen=True, slots=True, kw_only=True)
class Predictions:
    """One predicted length per prompt, with how good and where from."""

    lengths: np.ndarray
    quality: PredictorQuality | None
    provenance: dict[str, Any]
    profiled: tuple[np.ndarray, np.ndarray] | None = field(default=None)
    """(predicted, measured) pairs the predictor did not train on, for load calibration."""

    def calibrated_lengths(self) -> np.ndarray:
        """``lengths`` mapped through an isotonic fit on ``profiled`` (E[measured | predicted])."""
        if self.profiled is None:
            raise ValueError(
                f"calibrate_loads needs profiled (prediction, length) pairs, and predictor "
                f"{self.provenance.get('name')!r} got none; pass profiled pairs or set calibrate_loads: false"
            )
        return IsotonicCalibrator.fit(*self.profiled).transform(self.lengths)


def predict_lengths(
    spec: PredictorSpec,
    items: Sequence[PromptItem],
    *,
    true_lengths: Mapping[str, float] | None = None,
    profiled_pairs: Sequence[tuple[PromptItem, float]] | None = None,
) -> Predictions:
    """Run ``spec``'s predictor on ``items``; see the module docstring for what each type reads."""
    items = list(items)
    if spec.type == "oracle_noisy":
        return _oracle(spec, items, true_lengths)
    if true_lengths is not None:
        raise ValueError(
            f"true_lengths were passed but predictor.type is {spec.type!r}; only oracle_noisy uses measured lengths"
        )
    if spec.type == "file":
        if not spec.path:
            raise ValueError("predictor.type file needs predictor.path (JSONL prompt_id -> predicted_length)")
        predictor = FilePredictor(spec.path)
        provenance = {"name": "file", "path": spec.path}
        return _scored(
            predictor.predict(items), predictor.predict, _pairs(None, profiled_pairs, items), provenance
        )
    if spec.type == "text_features":
        return _text_features(spec, items, _require_pairs(spec, profiled_pairs, items))
    return _lm(spec, items, _pairs(spec.path, profiled_pairs, items))


def shown_ids(ids: Sequence[str]) -> str:
    """The first few ids for an error message, with how many more there are."""
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    return ", ".join(repr(i) for i in ids[:_SHOWN_IDS]) + more


def _oracle(
    spec: PredictorSpec, items: list[PromptItem], true_lengths: Mapping[str, float] | None
) -> Predictions:
    if (spec.path is None) == (true_lengths is None):
        raise ValueError(
            "predictor.type oracle_noisy needs measured lengths from exactly one source: set "
            "predictor.path (JSONL prompt_id -> length) or pass true_lengths, not both/neither"
        )
    table = (
        true_lengths if true_lengths is not None else load_predictions(str(spec.path), length_field="length")
    )
    missing = [i.prompt_id for i in items if i.prompt_id not in table]
    if missing:
        raise ValueError(
            f"no measured length for {len(missing)} of {len(items)} prompts ({shown_ids(missing)}); "
            "the oracle needs one per prompt - complete the lengths file or pass them all"
        )
    truth = np.asarray([float(table[i.prompt_id]) for i in items], dtype=np.float64)
    if spec.calibrate_nu:
        result = noisy_oracle_predictions(truth, spec.target_tau, spec.seed)
    else:
        result = noisy_oracle_with_nu(truth, spec.noise_sigma, spec.seed)
    pred = result.predictions
    profiled = profiled_indices(truth.size, spec.profiled_fraction, spec.seed)
    provenance = {
        "name": "noisy_oracle", "target_tau": spec.target_tau, "calibrate_nu": spec.calibrate_nu,
        "nu": result.nu, "seed": spec.seed, "lengths_from": spec.path or "true_lengths argument",
    }  # fmt: skip
    return Predictions(
        lengths=pred,
        quality=evaluate_predictor(pred, truth),
        provenance=provenance,
        profiled=(pred[profiled], truth[profiled]),
    )


def _pairs(
    path: str | None, given: Sequence[tuple[PromptItem, float]] | None, items: list[PromptItem]
) -> _Pairs | None:
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
    spec: PredictorSpec, given: Sequence[tuple[PromptItem, float]] | None, items: list[PromptItem]
) -> _Pairs:
    pairs = _pairs(spec.path, given, items)
    if pairs is None:
        raise ValueError(
            "predictor.type text_features is trained on profiled pairs: set predictor.path to a "
            "JSONL of {prompt_id, length, prompt} rows or pass profiled_pairs"
        )
    return pairs


def _scored(
    lengths: np.ndarray,
    predict: Callable[[list[PromptItem]], np.ndarray],
    pairs: _Pairs | None,
    provenance: dict[str, Any],
) -> Predictions:
    if pairs is None:
        return Predictions(lengths=lengths, quality=None, provenance=provenance)
    pair_pred = np.asarray(predict(pairs[0]), dtype=np.float64)
    return Predictions(
        lengths=lengths,
        quality=evaluate_predictor(pair_pred, pairs[1]),
        provenance={**provenance, "quality_on": f"{pairs[1].size} profiled pairs"},
        profiled=(pair_pred, pairs[1]),
    )


def _text_features(spec: PredictorSpec, items: list[PromptItem], pairs: _Pairs) -> Predictions:
    prompts, lengths = pairs
    train, test = split_by_prompt(prompts, holdout_fraction=spec.profiled_fraction, seed=spec.seed)
    model = TextFeaturePredictor().fit([prompts[i] for i in train], lengths[train])
    held_out = model.predict([prompts[i] for i in test])
    model.fit(prompts, lengths)
    provenance = {
        "name": "text_features", "pairs": len(prompts), "pairs_from": spec.path or "profiled_pairs",
        "quality_on": f"{test.size} held-out pairs",
    }  # fmt: skip
    return Predictions(
        lengths=model.predict(items),
        quality=evaluate_predictor(held_out, lengths[test]),
        provenance=provenance,
        profiled=(held_out, lengths[test]),
    )


def _lm(spec: PredictorSpec, items: list[PromptItem], pairs: _Pairs | None) -> Predictions:
    if not spec.model_path:
        raise ValueError("predictor.type lm needs predictor.model_path (a folder from LMRegressor.save)")
    # torch/transformers load only here, so the factory stays importable on CPU-only hosts.
    from asp_scheduler.predictors.lm_regressor import LMRegressor

    model = LMRegressor.load(spec.model_path)
    provenance = {"name": "lm_regressor", "model_path": spec.model_path}
    return _scored(model.predict(items), model.predict, pairs, provenance)
