"""ScheduleParams: one validated record; schedules carry it and old schedule files still load."""

import json
from dataclasses import asdict

import numpy as np
import pytest

from asp_scheduler import ScheduleParams, build_schedule
from asp_scheduler.schedule import Schedule, ordered_schedule


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"b": 0}, "b .*positive integer"),
        ({"kappa": -1}, "kappa"),
        ({"k": 0}, "k .*positive integer"),
        ({"sa_iterations": -5}, "sa_iterations must be an integer >= 0"),
        ({"sa_iterations": 1.5}, "sa_iterations"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"sa_constant": float("nan")}, "sa_constant"),
        ({"sa_constant": -1.0}, "sa_constant"),
        ({"calibration_fraction": 1.0}, r"calibration_fraction must be in \(0, 1\)"),
        ({"calibration_fraction": 0.0}, "calibration_fraction"),
        ({"dp_objective": "fastest"}, "unknown dp_objective 'fastest'"),
        ({"shuffle_groups": "yes"}, "shuffle_groups must be true or false"),
    ],
)
def test_bad_params_are_rejected_with_the_field_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScheduleParams(**kwargs)


def test_defaults_are_the_papers():
    p = ScheduleParams()
    assert (p.b, p.kappa, p.k, p.sa_iterations, p.sa_constant) == (32, 2, 6, 2_000_000, 1.0)


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['tau'\] in here; valid keys"):
        ScheduleParams.from_mapping({"b": 4, "tau": 0.5}, where="here")
    assert ScheduleParams.from_mapping({"b": 4}) == ScheduleParams(b=4)


def test_calibrated_lengths_and_the_calibrate_flag_must_agree():
    pred = np.random.default_rng(0).lognormal(6, 1, 64)
    with pytest.raises(ValueError, match="calibrate_loads=False but calibrated_lengths was given"):
        build_schedule(pred, ScheduleParams(b=8, k=2), calibrated_lengths=pred)
    with pytest.raises(ValueError, match="calibrate_loads=True but calibrated_lengths was not given"):
        build_schedule(pred, ScheduleParams(b=8, k=2, calibrate_loads=True))
    with pytest.raises(ValueError, match="params must be a ScheduleParams"):
        build_schedule(pred, 8)  # type: ignore[arg-type]  # the old positional b


def test_schedule_file_with_the_old_params_layout_loads_with_defaults(tmp_path):
    pred = np.random.default_rng(1).lognormal(6, 1, 100)
    s = build_schedule(pred, ScheduleParams(b=8, k=3, sa_iterations=1000, seed=4))
    s.save(tmp_path / "s.json")
    doc = json.loads((tmp_path / "s.json").read_text())
    for name in ("calibrate_loads", "calibration_fraction"):  # absent from files written before them
        del doc["params"][name]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert Schedule.load(tmp_path / "old.json").params == s.params
    doc["params"]["temperature"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['temperature'\] in .*bad.json params"):
        Schedule.load(tmp_path / "bad.json")


def test_saved_params_round_trip_every_field(tmp_path):
    params = ScheduleParams(
        b=4, kappa=1, k=2, sa_iterations=500, sa_constant=0.5, seed=9, shuffle_groups=True,
        calibrate_loads=True, calibration_fraction=0.3, dp_objective="padded_slots", normalize=True,
        allow_small=True,
    )  # fmt: skip
    pred = np.random.default_rng(2).lognormal(6, 1, 40)
    build_schedule(pred, params, calibrated_lengths=pred * 2).save(tmp_path / "s.json")
    assert asdict(Schedule.load(tmp_path / "s.json").params) == asdict(params)


def test_ordered_schedule_uses_the_group_rule_and_checks_coverage():
    pred = np.arange(1.0, 7.0)
    s = ordered_schedule(
        pred, [np.array([5, 4]), np.array([0]), np.array([1, 2, 3])], ScheduleParams(b=2, k=2)
    )
    assert s.batch_group_ids.tolist() == [0, 0, 1]
    assert s.predicted_loads.tolist() == [11.0, 1.0, 9.0]
    assert s.num_short_minibatches == 1
    with pytest.raises(ValueError, match="every one of the 6 items exactly once"):
        ordered_schedule(pred, [np.array([0, 1]), np.array([1, 2])], ScheduleParams(b=2, k=2))
