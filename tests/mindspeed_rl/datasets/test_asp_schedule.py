"""build_run_schedule: the run's ASP schedule from asp_config, for every predictor type."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from asp_scheduler.predictors.base import PromptItem
from mindspeed_rl.config_cls.asp_config import ASPConfig, PredictorConfig
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.datasets.asp_schedule import RunSchedule, build_run_schedule

_TOPICS = ("sum", "prove", "count", "bound")


def _records(n: int, seed: int = 0) -> tuple[list[PromptRecord], dict[str, float]]:
    """Prompts whose measured length grows with the number of requested steps in the text."""
    rng = np.random.default_rng(seed)
    records, lengths = [], {}
    for i in range(n):
        steps = int(rng.integers(1, 9))
        text = f"Problem {i}: " + " then ".join(_TOPICS[(i + s) % 4] for s in range(steps))
        records.append(PromptRecord(f"p{i:04d}", text, (), "42"))
        lengths[f"p{i:04d}"] = float(round(100 * steps * np.exp(rng.normal(0, 0.3))) + 1)
    return records, lengths


def _config(kind: str = "oracle_noisy", **overrides: object) -> ASPConfig:
    predictor = overrides.pop("predictor", PredictorConfig(type=kind))  # type: ignore[arg-type]
    base = ASPConfig(predictor=predictor, b=8, kappa=2, k=3, sa_iterations=20_000)  # type: ignore[arg-type]
    return replace(base, **overrides)  # type: ignore[arg-type]


def _pairs(records: list[PromptRecord], lengths: dict[str, float]) -> list[tuple[PromptItem, float]]:
    return [(PromptItem(r.prompt_id, r.text), lengths[r.prompt_id]) for r in records]


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _check_covers_once(run: RunSchedule, records: list[PromptRecord], b: int, kappa: int) -> None:
    listed = [pid for m in run.minibatches for pid in m.prompt_ids]
    assert sorted(listed) == sorted(r.prompt_id for r in records)
    sizes = [m.num_prompts for m in run.minibatches]
    short = [s for s in sizes if s < b]
    assert all(s <= b + kappa for s in sizes)
    assert len(short) == run.schedule.num_short_minibatches <= 1
    assert [m.order_index for m in run.minibatches] == list(range(len(sizes)))
    assert [m.batch_group_id for m in run.minibatches] == [p // 3 for p in range(len(sizes))]


def _build(kind: str, tmp_path: Path, records: list[PromptRecord], lengths: dict[str, float]) -> RunSchedule:
    if kind == "oracle_noisy":
        return build_run_schedule(_config(), records, true_lengths=lengths)
    if kind == "file":
        rows = [{"prompt_id": pid, "predicted_length": v * 1.1} for pid, v in lengths.items()]
        path = _write_jsonl(tmp_path / "pred.jsonl", rows)
        return build_run_schedule(_config(predictor=PredictorConfig(type="file", path=path)), records)
    return build_run_schedule(_config("text_features"), records, profiled_pairs=_pairs(records, lengths))


@pytest.mark.parametrize("kind", ["oracle_noisy", "file", "text_features"])
@pytest.mark.parametrize("num_prompts", [203, 13])
def test_every_prompt_is_scheduled_once_in_sizes_b_to_b_plus_kappa(tmp_path, kind, num_prompts):
    # 13 = 8..10 + a remainder: not splittable into [8, 10], so exactly one short minibatch.
    records, lengths = _records(num_prompts)
    run = _build(kind, tmp_path, records, lengths)
    _check_covers_once(run, records, b=8, kappa=2)
    assert run.schedule.num_short_minibatches == (1 if num_prompts == 13 else 0)
    index = {r.prompt_id: i for i, r in enumerate(records)}
    pred = run.schedule.predicted_lengths
    for m in run.minibatches:
        assert m.predicted_load == pytest.approx(sum(pred[index[p]] for p in m.prompt_ids))
    assert run.schedule.predicted_metrics.padding < 0.5


def test_predictor_quality_is_reported_per_type(tmp_path):
    records, lengths = _records(300)
    oracle = _build("oracle_noisy", tmp_path, records, lengths)
    assert oracle.predictor_quality is not None
    assert abs(oracle.predictor_quality.kendall_tau - 0.64) <= 0.02
    learned = _build("text_features", tmp_path, records, lengths)
    assert learned.predictor_quality is not None and learned.predictor_quality.num_pairs == 60
    assert learned.predictor_quality.kendall_tau > 0.3  # the step count in the text drives length
    assert _build("file", tmp_path, records, lengths).predictor_quality is None


def test_c0_keeps_dataset_order_and_fixed_size():
    records, _ = _records(21)
    run = build_run_schedule(_config("none", b=4), records)
    assert [m.prompt_ids for m in run.minibatches] == [
        tuple(r.prompt_id for r in records[i : i + 4]) for i in range(0, 21, 4)
    ]
    assert [m.predicted_load for m in run.minibatches] == [0.0] * 6
    assert run.schedule.num_short_minibatches == 1 and run.predictor_quality is None


def test_oracle_reads_lengths_file_and_fixed_nu_without_search(tmp_path):
    records, lengths = _records(120)
    path = _write_jsonl(tmp_path / "len.jsonl", [{"prompt_id": p, "length": v} for p, v in lengths.items()])
    exact = PredictorConfig(type="oracle_noisy", path=path, calibrate_nu=False, noise_sigma=0.0)
    run = build_run_schedule(_config(predictor=exact), records)
    truth = np.array([lengths[r.prompt_id] for r in records])
    np.testing.assert_allclose(run.schedule.predicted_lengths, truth)
    assert run.schedule.predictor["nu"] == 0.0 and run.schedule.predictor["lengths_from"] == path


def test_calibrated_loads_are_monotone_in_the_prediction():
    records, lengths = _records(400)
    run = build_run_schedule(_config(calibrate_loads=True), records, true_lengths=lengths)
    cal = run.schedule.calibrated_lengths
    assert cal is not None
    order = np.argsort(run.schedule.predicted_lengths, kind="stable")
    assert np.all(np.diff(cal[order]) >= 0)
    assert not np.allclose(cal, run.schedule.predicted_lengths)
    _check_covers_once(run, records, b=8, kappa=2)


def test_text_features_reads_pairs_file_and_takes_missing_texts_from_records(tmp_path):
    records, lengths = _records(150)
    rows: list[dict[str, object]] = [{"prompt_id": p, "length": v} for p, v in lengths.items()]
    rows.append({"prompt_id": "extra", "length": 50.0, "prompt": "Problem x: sum"})
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    run = build_run_schedule(_config(predictor=PredictorConfig(type="text_features", path=path)), records)
    _check_covers_once(run, records, b=8, kappa=2)
    assert run.schedule.predictor["pairs"] == 151


def test_saved_schedule_round_trips_and_must_match_the_prompt_set(tmp_path):
    records, lengths = _records(100)
    first = build_run_schedule(_config(), records, true_lengths=lengths)
    path = tmp_path / "schedule.json"
    first.schedule.save(path)
    again = build_run_schedule(_config(schedule_path=str(path)), list(reversed(records)))
    assert again.minibatches == first.minibatches
    with pytest.raises(
        ValueError, match=r"does not cover exactly.*lacks: none; prompts not in this run: 'p0099'"
    ):
        build_run_schedule(_config(schedule_path=str(path)), records[:-1])
    stranger = PromptRecord("q1", "new", (), "1")
    with pytest.raises(ValueError, match=r"run prompts it lacks: 'q1'; prompts not in this run: none"):
        build_run_schedule(_config(schedule_path=str(path)), [*records, stranger])
    with pytest.raises(ValueError, match="built with b=8, k=3"):
        build_run_schedule(_config(schedule_path=str(path), k=4), records)
    with pytest.raises(ValueError, match="does not exist"):
        build_run_schedule(_config(schedule_path=str(tmp_path / "nope.json")), records)


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        (_config(), {}, "exactly one source"),
        (
            _config(predictor=PredictorConfig(type="oracle_noisy", path="x.jsonl")),
            {"lengths": 1},
            "exactly one",
        ),
        (_config(), {"lengths": 1, "drop": "p0003"}, r"no measured length for 1 of 30 prompts \('p0003'\)"),
        (_config("text_features"), {}, "text_features is trained on profiled pairs"),
        (_config("file"), {}, "file needs predictor.path"),
        (_config("file"), {"lengths": 1}, "only oracle_noisy uses measured lengths"),
        (_config("lm"), {}, "lm needs predictor.model_path"),
        (_config("none", calibrate_loads=True), {}, "calibrate_loads needs predicted lengths"),
        (_config("none", b=31), {}, "only 30 prompts but asp_config.b=31"),
    ],
)
def test_bad_configs_get_clear_errors(config, kwargs, message):
    records, lengths = _records(30)
    true_lengths = None
    if kwargs.get("lengths"):
        true_lengths = {p: v for p, v in lengths.items() if p != kwargs.get("drop")}
    with pytest.raises(ValueError, match=message):
        build_run_schedule(config, records, true_lengths=true_lengths)


def test_calibration_without_profiled_pairs_and_duplicate_ids_are_rejected(tmp_path):
    records, lengths = _records(40)
    path = _write_jsonl(
        tmp_path / "p.jsonl", [{"prompt_id": p, "predicted_length": v} for p, v in lengths.items()]
    )
    cfg = _config(predictor=PredictorConfig(type="file", path=path), calibrate_loads=True)
    with pytest.raises(ValueError, match="calibrate_loads needs profiled"):
        build_run_schedule(cfg, records)
    with pytest.raises(ValueError, match="occurs twice"):
        build_run_schedule(_config("none"), [*records, records[0]])
    with pytest.raises(ValueError, match="no prompts to schedule"):
        build_run_schedule(_config("none"), [])


def test_lm_predictor_is_loaded_from_its_folder(tmp_path):
    pytest.importorskip("torch")
    from asp_scheduler.predictors.lm_regressor import LMRegressor, LMRegressorConfig
    from tests.asp_scheduler.test_lm_regressor import build_tiny_model

    records, lengths = _records(40)
    items = [PromptItem(r.prompt_id, r.text) for r in records]
    model = LMRegressor(build_tiny_model(tmp_path / "base"), LMRegressorConfig(epochs=1, lr=1e-3))
    model.fit(items, np.array([lengths[i.prompt_id] for i in items])).save(tmp_path / "lm")
    cfg = _config(predictor=PredictorConfig(type="lm", model_path=str(tmp_path / "lm")), calibrate_loads=True)
    run = build_run_schedule(cfg, records, profiled_pairs=_pairs(records[:20], lengths))
    _check_covers_once(run, records, b=8, kappa=2)
    assert run.predictor_quality is not None and run.predictor_quality.num_pairs == 20
    assert run.schedule.calibrated_lengths is not None


def test_schedule_params_carry_every_scheduling_field_of_asp_config():
    from dataclasses import fields

    from asp_scheduler import ScheduleParams

    names = [f.name for f in fields(ScheduleParams)]
    assert set(names) <= {f.name for f in fields(ASPConfig)}
    # A value unlike the default for every field, so a field left behind shows up.
    changed = {
        "b": 5, "kappa": 3, "k": 4, "sa_iterations": 123, "sa_constant": 0.25, "seed": 11,
        "shuffle_groups": not ASPConfig().shuffle_groups, "calibrate_loads": True,
        "calibration_fraction": 0.35, "dp_objective": "padded_slots", "normalize": True, "allow_small": True,
    }  # fmt: skip
    assert set(changed) == set(names)
    params = replace(ASPConfig(), **changed).schedule_params()  # type: ignore[arg-type]
    assert {n: getattr(params, n) for n in names} == changed
    defaults = ASPConfig().schedule_params()
    # The run's defaults are the scheduler's, except that a run shuffles whole groups.
    assert replace(defaults, shuffle_groups=False) == ScheduleParams()


def test_config_schedule_equals_the_explicit_build_schedule_call():
    from asp_scheduler import ScheduleParams, build_schedule
    from asp_scheduler.calibration import IsotonicCalibrator, profiled_indices
    from asp_scheduler.predictors import noisy_oracle_predictions

    records, lengths = _records(120)
    cfg = _config(seed=5, shuffle_groups=True, calibrate_loads=True, calibration_fraction=0.25)
    run = build_run_schedule(cfg, records, true_lengths=lengths)
    truth = np.array([lengths[r.prompt_id] for r in records])
    pred = noisy_oracle_predictions(truth, 0.64, 5).predictions
    picked = profiled_indices(truth.size, 0.25, 5)
    explicit = build_schedule(
        pred,
        ScheduleParams(b=8, kappa=2, k=3, sa_iterations=20_000, seed=5, shuffle_groups=True, calibrate_loads=True,
                       calibration_fraction=0.25),
        calibrated_lengths=IsotonicCalibrator.fit(pred[picked], truth[picked]).transform(pred),
    )  # fmt: skip
    assert run.schedule.params == explicit.params
    assert [m.tolist() for m in run.schedule.minibatches] == [m.tolist() for m in explicit.minibatches]
    assert np.array_equal(run.schedule.calibrated_lengths, explicit.calibrated_lengths)
