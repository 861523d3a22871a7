from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asp_scheduler.predictors.base import LengthPredictor, PromptItem, evaluate_predictor
from asp_scheduler.predictors.holdout import group_by_prompt, split_by_prompt
from asp_scheduler.predictors.text_features import (
    NUM_NUMERIC_FEATURES,
    TextFeatureConfig,
    TextFeaturePredictor,
    numeric_features,
)

_FILLER = ["the", "value", "of", "a", "triangle", "integer", "sum", "$x$", "real", "set"]


def _synthetic(num_prompts: int, samples: int, seed: int) -> tuple[list[PromptItem], np.ndarray]:
    """Length grows with the number of listed items and triples for 'prove' tasks, with sampling noise."""
    rng = np.random.default_rng(seed)
    prompts: list[PromptItem] = []
    lengths: list[float] = []
    for i in range(num_prompts):
        num_items = int(rng.integers(1, 12))
        prove = bool(rng.random() < 0.5)
        words = " ".join(rng.choice(_FILLER, size=int(rng.integers(3, 8))))
        items = ", ".join(str(int(v)) for v in rng.integers(10, 99, size=num_items))
        text = f"{'Prove' if prove else 'Compute'} {words}: {items}."
        mean = 40.0 * num_items * (3.0 if prove else 1.0)
        for _ in range(samples):
            prompts.append(PromptItem(prompt_id=f"q{i}", text=text))
            lengths.append(mean * float(np.exp(rng.normal(0.0, 0.2))))
    return prompts, np.asarray(lengths)


def test_learns_an_easy_relation_on_held_out_prompts() -> None:
    prompts, lengths = _synthetic(240, 4, seed=0)
    predictor = TextFeaturePredictor()
    quality = predictor.fit_report(prompts, lengths, holdout_fraction=0.25, seed=0)
    assert quality.num_pairs == 60 * 4
    assert quality.kendall_tau > 0.6
    # A constant predictor scores tau 0; the MAE must also beat predicting the median.
    median_mae = float(np.mean(np.abs(lengths - np.median(lengths))))
    assert quality.mae_tokens < 0.6 * median_mae


def test_predictions_are_positive_float64_and_deterministic() -> None:
    prompts, lengths = _synthetic(60, 2, seed=1)
    predictor: LengthPredictor = TextFeaturePredictor()  # mypy checks the Protocol here
    first = predictor.fit(prompts, lengths).predict(prompts)
    second = TextFeaturePredictor().fit(prompts, lengths).predict(prompts)
    assert first.dtype == np.float64 and first.shape == (120,)
    assert np.all(first > 0)
    np.testing.assert_array_equal(first, second)


def test_predictions_stay_inside_the_training_range() -> None:
    prompts, lengths = _synthetic(60, 1, seed=2)
    predictor = TextFeaturePredictor().fit(prompts, lengths)
    huge = PromptItem("huge", "Prove " + ", ".join(["55"] * 2000) + ".")
    predicted = predictor.predict([huge, PromptItem("empty", "")])
    assert np.all(predicted >= lengths.min() - 1e-6) and np.all(predicted <= lengths.max() + 1e-6)


_HASH_SCRIPT = """
import numpy as np
from asp_scheduler.predictors.base import PromptItem
from asp_scheduler.predictors.text_features import TextFeaturePredictor
texts = ["Prove that 2+2=4.", "Compute the sum of 1, 2, 3.", "Find $x$ if $x^2 = 9$."]
prompts = [PromptItem(str(i), t) for i, t in enumerate(texts)]
pred = TextFeaturePredictor().fit(prompts, np.array([300.0, 50.0, 120.0])).predict(prompts[::-1])
print(",".join(repr(float(v)) for v in pred))
"""


def test_features_do_not_depend_on_python_hash_seed() -> None:
    root = Path(__file__).resolve().parents[2]
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
        result = subprocess.run(
            [sys.executable, "-c", _HASH_SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(result.stdout.strip())
    assert outputs[0] == outputs[1] and outputs[0]


def test_pairs_aggregation_equals_fitting_per_prompt_geometric_means() -> None:
    # With squared loss on log length, every sample of a prompt counts like its mean log length.
    prompts, lengths = _synthetic(50, 8, seed=3)
    groups = group_by_prompt(prompts, lengths)
    on_pairs = TextFeaturePredictor().fit(prompts, lengths)
    on_means = TextFeaturePredictor().fit(groups.prompts, np.exp(groups.mean_log_length))
    np.testing.assert_allclose(on_pairs.predict(groups.prompts), on_means.predict(groups.prompts), rtol=1e-4)
    mean_cfg = TextFeatureConfig(aggregate="prompt_mean")
    on_arith = TextFeaturePredictor(mean_cfg).fit(prompts, lengths).predict(groups.prompts)
    assert not np.allclose(on_arith, on_pairs.predict(groups.prompts), rtol=1e-4)


def test_group_by_prompt_collapses_repeats_and_checks_texts() -> None:
    prompts = [PromptItem("a", "x"), PromptItem("b", "y"), PromptItem("a", "x")]
    groups = group_by_prompt(prompts, np.array([10.0, 20.0, 40.0]))
    assert [p.prompt_id for p in groups.prompts] == ["a", "b"]
    np.testing.assert_array_equal(groups.counts, [2.0, 1.0])
    np.testing.assert_allclose(np.exp(groups.mean_log_length), [20.0, 20.0])
    np.testing.assert_allclose(np.exp(groups.log_mean_length), [25.0, 20.0])
    np.testing.assert_array_equal(groups.row_to_group, [0, 1, 0])
    with pytest.raises(ValueError, match="'a' appears with two different texts"):
        group_by_prompt([PromptItem("a", "x"), PromptItem("a", "z")], np.array([1.0, 2.0]))


@pytest.mark.parametrize("bad", [[1.0, 0.0], [1.0, -5.0], [1.0, float("nan")]])
def test_invalid_lengths_are_rejected(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="not a positive finite token count"):
        TextFeaturePredictor().fit([PromptItem("a", "x"), PromptItem("b", "y")], np.array(bad))
    with pytest.raises(ValueError, match="one length per prompt row"):
        TextFeaturePredictor().fit([PromptItem("a", "x")], np.array([1.0, 2.0]))


def test_split_by_prompt_never_leaks_a_prompt() -> None:
    prompts, _ = _synthetic(40, 8, seed=4)
    train, test = split_by_prompt(prompts, holdout_fraction=0.2, seed=7)
    train_ids = {prompts[i].prompt_id for i in train}
    test_ids = {prompts[i].prompt_id for i in test}
    assert not train_ids & test_ids
    assert len(test_ids) == 8 and len(train_ids) == 32
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(len(prompts)))
    again, _ = split_by_prompt(prompts, holdout_fraction=0.2, seed=7)
    other, _ = split_by_prompt(prompts, holdout_fraction=0.2, seed=8)
    np.testing.assert_array_equal(train, again)
    assert not np.array_equal(train, other)
    with pytest.raises(ValueError, match="at least 2 distinct prompt ids"):
        split_by_prompt([PromptItem("a", "x")] * 3, holdout_fraction=0.5, seed=0)
    with pytest.raises(ValueError, match="holdout_fraction"):
        split_by_prompt(prompts, holdout_fraction=1.0, seed=0)


def test_fit_report_scores_held_out_rows_then_refits_on_everything() -> None:
    prompts, lengths = _synthetic(50, 3, seed=5)
    predictor = TextFeaturePredictor()
    quality = predictor.fit_report(prompts, lengths, holdout_fraction=0.2, seed=1)
    _, test = split_by_prompt(prompts, holdout_fraction=0.2, seed=1)
    held_out_fit = TextFeaturePredictor().fit(
        [p for i, p in enumerate(prompts) if i not in set(test)], np.delete(lengths, test)
    )
    expected = evaluate_predictor(held_out_fit.predict([prompts[i] for i in test]), lengths[test])
    assert quality == expected
    full = TextFeaturePredictor().fit(prompts, lengths)
    np.testing.assert_array_equal(predictor.predict(prompts), full.predict(prompts))


def test_numeric_features_count_what_they_claim() -> None:
    feats = numeric_features(["ab 12 + 3.5 $x$ \\frac{1}{2}!\nline two", ""])
    assert feats.shape == (2, NUM_NUMERIC_FEATURES)
    raw = np.expm1(feats[0, :-1])
    # chars, lines, word tokens, digits, operators, backslashes, dollars, sentence marks, brackets, digit runs
    np.testing.assert_allclose(raw[[1, 3, 4, 5, 6, 7, 8, 9]], [2, 6, 1, 1, 2, 2, 4, 5])
    np.testing.assert_array_equal(feats[1], [0.0, np.log1p(1.0)] + [0.0] * (NUM_NUMERIC_FEATURES - 2))


def test_predict_before_fit_and_bad_config_raise() -> None:
    with pytest.raises(ValueError, match="before fit"):
        TextFeaturePredictor().predict([PromptItem("a", "x")])
    with pytest.raises(ValueError, match="char_ngrams"):
        TextFeatureConfig(char_ngrams=(3, 2))
    with pytest.raises(ValueError, match="ridge_alpha"):
        TextFeatureConfig(ridge_alpha=0.0)
    with pytest.raises(ValueError, match="aggregate"):
        TextFeatureConfig(aggregate="median")  # type: ignore[arg-type]
