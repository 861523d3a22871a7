"""predict_lengths: the spec picks the predictor; profiled pairs feed calibration."""

import json

import numpy as np
import pytest

from asp_scheduler.calibration import profiled_indices
from asp_scheduler.predictors import PredictorSpec, PromptItem, noisy_oracle_predictions, predict_lengths


def _items(n):
    return [PromptItem(prompt_id=f"q{i}", text="step " * (1 + i % 5)) for i in range(n)]


def test_oracle_uses_the_spec_seed_and_profiles_the_shared_subset():
    items = _items(50)
    truth = {it.prompt_id: 10.0 * (1 + i % 5) + i for i, it in enumerate(items)}
    spec = PredictorSpec(type="oracle_noisy", target_tau=0.8, seed=7, profiled_fraction=0.3)
    preds = predict_lengths(spec, items, true_lengths=truth)
    values = np.array(list(truth.values()))
    expected = noisy_oracle_predictions(values, 0.8, 7).predictions
    assert np.array_equal(preds.lengths, expected)
    chosen = profiled_indices(50, 0.3, 7)
    assert preds.profiled is not None
    assert np.array_equal(preds.profiled[1], values[chosen]) and chosen.size == 15
    calibrated = preds.calibrated_lengths()
    order = np.argsort(preds.lengths, kind="stable")
    assert np.all(np.diff(calibrated[order]) >= 0)  # isotonic: keeps the sort order


def test_file_predictor_without_pairs_has_no_quality_and_cannot_calibrate(tmp_path):
    items = _items(6)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": it.prompt_id, "predicted_length": 5.0 + i}) + "\n"
                            for i, it in enumerate(items)))  # fmt: skip
    preds = predict_lengths(PredictorSpec(type="file", path=str(path)), items)
    assert preds.lengths.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert preds.quality is None and preds.provenance == {"name": "file", "path": str(path)}
    with pytest.raises(ValueError, match="calibrate_loads needs profiled .* predictor 'file' got none"):
        preds.calibrated_lengths()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "none"}, "unknown predictor type 'none'"),
        ({"type": "oracle_noisy", "profiled_fraction": 1.0}, "profiled_fraction"),
    ],
)
def test_bad_specs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PredictorSpec(**kwargs)
