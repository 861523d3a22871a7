from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asp_scheduler.predictors.base import LengthPredictor, PromptItem
from asp_scheduler.predictors.from_file import FilePredictor, load_predictions, save_predictions


def _items(ids: list[str]) -> list[PromptItem]:
    return [PromptItem(prompt_id=i, text=f"text of {i}") for i in ids]


def _write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_save_then_predict_round_trips_exactly(tmp_path: Path, suffix: str) -> None:
    ids = [f"p{i}" for i in range(50)]
    lengths = np.random.default_rng(0).lognormal(6.0, 1.0, size=50)
    path = save_predictions(tmp_path / f"pred{suffix}", ids, lengths)
    predictor = FilePredictor(path)
    query = list(reversed(ids))
    predicted = predictor.predict(_items(query))
    assert predicted.dtype == np.float64
    np.testing.assert_array_equal(predicted, lengths[::-1])
    assert len(predictor) == 50


def test_fit_is_a_no_op_returning_self(tmp_path: Path) -> None:
    path = save_predictions(tmp_path / "p.jsonl", ["a", "b"], [10.0, 20.0])
    predictor: LengthPredictor = FilePredictor(path)  # mypy checks the Protocol here
    assert predictor.fit(_items(["a", "b"]), np.array([99.0, 1.0])) is predictor
    np.testing.assert_array_equal(predictor.predict(_items(["b", "a"])), [20.0, 10.0])


def test_custom_field_names_and_integer_ids(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": 7, "len": 123}, {"id": "x", "len": 4.5}])
    predictor = FilePredictor(path, id_field="id", length_field="len")
    np.testing.assert_array_equal(predictor.predict(_items(["x", "7"])), [4.5, 123.0])


def test_csv_with_custom_columns(tmp_path: Path) -> None:
    path = save_predictions(tmp_path / "p.csv", ["a", "b"], [1.5, 2.0], id_field="uid", length_field="tokens")
    assert path.read_text().splitlines()[0] == "uid,tokens"
    assert load_predictions(path, id_field="uid", length_field="tokens") == {"a": 1.5, "b": 2.0}


def test_missing_ids_are_reported_with_count_and_names(tmp_path: Path) -> None:
    path = save_predictions(tmp_path / "p.jsonl", ["a"], [1.0])
    with pytest.raises(ValueError, match=r"p\.jsonl: no prediction for 2 of 3 prompts \('b', 'c'\)"):
        FilePredictor(path).predict(_items(["a", "b", "c"]))


def test_identical_duplicates_are_accepted_conflicting_ones_rejected(tmp_path: Path) -> None:
    same = _write_jsonl(tmp_path / "same.jsonl", [{"prompt_id": "a", "predicted_length": 5}] * 2)
    assert load_predictions(same) == {"a": 5.0}
    rows = [
        {"prompt_id": "a", "predicted_length": 5},
        {"prompt_id": "b", "predicted_length": 6},
        {"prompt_id": "a", "predicted_length": 7},
    ]
    conflict = _write_jsonl(tmp_path / "conflict.jsonl", rows)
    with pytest.raises(
        ValueError, match=r"conflict\.jsonl:3: prompt id 'a' has length 7\.0 here but 5\.0 on line 1"
    ):
        load_predictions(conflict)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("abc", "not a number"),
        (True, "not a number"),
        (None, "not a number"),
        (-3, "finite and > 0"),
        (0, "> 0"),
    ],
)
def test_bad_lengths_name_file_and_line(tmp_path: Path, raw: object, problem: str) -> None:
    rows = [{"prompt_id": "ok", "predicted_length": 1}, {"prompt_id": "bad", "predicted_length": raw}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ValueError, match=rf"p\.jsonl:2: .*{problem}"):
        load_predictions(path)


def test_nan_and_infinite_lengths_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_id": "a", "predicted_length": NaN}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1: .*nan.*finite"):
        load_predictions(path)
    csv_path = tmp_path / "p.csv"
    csv_path.write_text("prompt_id,predicted_length\na,1\nb,inf\n")
    with pytest.raises(ValueError, match=r"p\.csv:3: .*inf"):
        load_predictions(csv_path)


def test_empty_file_blank_lines_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no predictions found"):
        FilePredictor(empty)
    header_only = tmp_path / "h.csv"
    header_only.write_text("prompt_id,predicted_length\n")
    with pytest.raises(ValueError, match="no predictions found"):
        load_predictions(header_only)
    with pytest.raises(ValueError, match="not found"):
        FilePredictor(tmp_path / "absent.jsonl")


def test_structural_errors_name_the_line_and_fix(tmp_path: Path) -> None:
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"prompt_id": "a", "predicted_length": 1}\n{not json\n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2: invalid JSON"):
        load_predictions(broken)
    missing = _write_jsonl(tmp_path / "m.jsonl", [{"prompt_id": "a", "length": 1}])
    with pytest.raises(ValueError, match=r"m\.jsonl:1: field 'predicted_length' is missing.*length_field="):
        load_predictions(missing)
    bad_header = tmp_path / "c.csv"
    bad_header.write_text("id,predicted_length\na,1\n")
    with pytest.raises(ValueError, match=r"column 'prompt_id' is missing"):
        load_predictions(bad_header)
    with pytest.raises(ValueError, match="unsupported prediction file type '.txt'"):
        load_predictions(tmp_path / "p.txt")


def test_save_predictions_validates_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one length per prompt id"):
        save_predictions(tmp_path / "p.jsonl", ["a", "b"], [1.0])
    with pytest.raises(ValueError, match="not unique"):
        save_predictions(tmp_path / "p.jsonl", ["a", "a"], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"prompt 'b'.*finite and > 0"):
        save_predictions(tmp_path / "p.jsonl", ["a", "b"], [1.0, float("nan")])
    assert not list(tmp_path.iterdir()), "a rejected save must leave no file behind"
