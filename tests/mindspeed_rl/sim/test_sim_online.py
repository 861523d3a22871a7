"""Length drift models and the C4 offline-vs-online comparison on a small preset."""

from __future__ import annotations

import numpy as np
import pytest

from mindspeed_rl.sim.drift import DriftModel, DriftParams, epoch_of, prompt_key, two_epochs
from mindspeed_rl.sim.online import OnlineSettings, block_cv, compare_online
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.workload import SyntheticWorkload

PRESET = {
    "profile": {
        "decode": {"per_step_seconds": 0.01, "per_token_seconds": 0.0001},
        "train": {"per_step_seconds": 1.0},
        "weight_flow": {"save_seconds": 0.5, "convert_seconds": 0.5, "load_seconds": 0.5},
    },
    "cluster": {"num_generation_units": 2, "actors_per_gu": 2},
    "workload": {"synthetic": {"num_prompts": 96, "num_samples_per_prompt": 2, "median_tokens": 400}},
    "schedule": {"b": 4, "kappa": 1, "k": 3, "tau": 0.7, "sa_iterations": 2000},
    "runtime": {"num_prompts_per_global_batch": 8, "queue_max_samples": 64, "queue_resume_samples": 32},
}


def _workload():
    base = SyntheticWorkload(num_prompts=200, num_samples_per_prompt=4, median_tokens=1000).draw(0)
    return two_epochs(base, seed=0, resample_sigma=0.3)


def test_two_epochs_names_each_pass_and_resamples_the_second() -> None:
    w = _workload()
    assert w.num_prompts == 400 and w.prompt_ids[0] == "s0#e0" and w.prompt_ids[200] == "s0#e1"
    assert prompt_key("s7#e1") == "s7" and epoch_of("s7#e1") == 1
    first, second = np.log(w.lengths[:200].mean(1)), np.log(w.lengths[200:].mean(1))
    assert 0.9 < np.corrcoef(first, second)[0, 1] < 0.999


def test_hetero2x_doubles_the_mean_and_keeps_each_prompts_direction() -> None:
    w = _workload()
    params = DriftParams(max_tokens=10**9)
    model = DriftModel("hetero2x", w, params, seed=0)
    rows = list(range(200))
    ratio = model.lengths(rows, 1.0).mean(1) / w.lengths[:200].mean(1)
    assert ratio.mean() == pytest.approx(2.0, rel=0.02)
    assert ratio.min() < 1.0 < 2.0 < ratio.max()  # some prompts shorten, others grow past 2x
    again = model.lengths(list(range(200, 400)), 1.0).mean(1) / w.lengths[200:].mean(1)
    assert np.corrcoef(np.log(ratio), np.log(again))[0, 1] > 0.99  # same prompt, same direction
    np.testing.assert_array_equal(model.lengths(rows, 0.0), w.lengths[:200])
    none = DriftModel("none", w, params, seed=0)
    np.testing.assert_array_equal(none.lengths(rows, 0.7), w.lengths[:200])


def test_noise2x_per_prompt_part_does_not_repeat_across_epochs() -> None:
    w = _workload()
    model = DriftModel("noise2x", w, DriftParams(max_tokens=10**9), seed=0)
    first = model.lengths(list(range(200)), 1.0).mean(1) / w.lengths[:200].mean(1)
    second = model.lengths(list(range(200, 400)), 1.0).mean(1) / w.lengths[200:].mean(1)
    assert first.mean() == pytest.approx(2.0, rel=0.15)
    assert abs(np.corrcoef(np.log(first), np.log(second))[0, 1]) < 0.25
    with pytest.raises(ValueError, match="unknown length drift"):
        DriftModel("linear", w, DriftParams(), seed=0)


def test_compare_online_consumes_every_prompt_once_and_replans() -> None:
    preset = SimPreset.from_mapping(PRESET)
    report = compare_online(
        preset, preset.load_workload(), ["hetero2x"], [0], settings=OnlineSettings(cv_block=4)
    )
    rows = {(c["schedule"], c["drift"]): c for c in report["conditions"]}
    assert set(rows) == {(s, d) for s in ("offline", "online") for d in ("none", "hetero2x")}
    for row in rows.values():
        assert row["prompts_consumed"] == 192 and row["num_iterations"] == 24
        assert row["group_cv_mean"] > 0 and row["iteration_s_mean"] > 0
    assert rows[("offline", "hetero2x")]["schedule_replans"] == 0
    online = rows[("online", "hetero2x")]
    assert online["schedule_replans"] >= 1 and online["replan_wall_s_mean"] > 0
    assert {s["source"] for s in online["last_refit"]["sources"]} == {"prior", "history"}
    assert report["drift_model"]["parameters"]["growth"] == 2.0


def test_block_cv_uses_full_groups_within_blocks() -> None:
    from mindspeed_rl.runtime import ScheduledMinibatch

    def mb(i: int, group: int, load: float) -> ScheduledMinibatch:
        return ScheduledMinibatch(
            minibatch_id=i, prompt_ids=(f"p{i}",), batch_group_id=group, predicted_load=load, order_index=i
        )

    generated = [(mb(0, 0, 1.0), 10.0), (mb(1, 0, 1.0), 10.0), (mb(2, 1, 1.0), 30.0), (mb(3, 1, 3.0), 30.0)]
    generated.append((mb(4, 2, 1.0), 1.0))  # a short group: left out
    cv = block_cv(generated, k=2, block=2)
    assert cv["num_groups"] == 2
    assert cv["measured"] == pytest.approx(np.std([20, 60]) / 40)
    assert cv["predicted"] == pytest.approx(np.std([2, 4]) / 3)


def test_informed_estimates_know_what_the_model_lets_a_run_know() -> None:
    """A repeat's estimate knows the prompt's whole rate: it equals the drifted length up to the
    factor every prompt shares; a first generation misses the prompt's own difficulty unless
    difficulty is its length alone (rho = 1)."""
    from mindspeed_rl.sim.drift import two_epochs
    from mindspeed_rl.sim.workload import Workload

    rng = np.random.default_rng(3)
    base = Workload(
        prompt_ids=tuple(f"p{i}" for i in range(40)),
        lengths=rng.integers(50, 4000, size=(40, 4)),
        source="test",
    )
    w = two_epochs(base, seed=0, resample_sigma=0.0)
    first, repeat = list(range(40)), list(range(40, 80))
    for t in (0.2, 0.7):
        for rho, first_exact in ((0.5, False), (1.0, True)):
            model = DriftModel("hetero2x", w, DriftParams(difficulty_length_corr=rho), seed=1)
            shared = model.lengths(repeat, t).mean(axis=1) / model.informed_estimates(repeat, t)
            assert np.ptp(np.log(shared)) < 0.01  # rounding only
            own = model.lengths(first, t).mean(axis=1) / model.informed_estimates(first, t)
            assert (np.ptp(np.log(own)) < 0.01) == first_exact
    noise = DriftModel("noise2x", w, DriftParams(), seed=1)
    ratio = noise.informed_estimates(repeat, 0.5) / w.lengths[first].mean(axis=1)
    assert np.ptp(ratio) < 1e-9  # the fresh draw is unknowable: the base lengths, grown alike


def test_compare_online_with_bound_adds_bound_rows() -> None:
    preset = SimPreset.from_mapping(PRESET)
    report = compare_online(
        preset,
        preset.load_workload(),
        ["hetero2x"],
        [0],
        settings=OnlineSettings(cv_block=4),
        with_bound=True,
    )
    bound = [c for c in report["conditions"] if c["schedule"] == "bound"]
    assert {c["drift"] for c in bound} == {"none", "hetero2x"}
    assert all(c["prompts_consumed"] == 192 and c["schedule_replans"] >= 1 for c in bound)
    hetero = next(a for a in report["aggregate"] if a["drift"] == "hetero2x")
    assert hetero["bound_group_cv_ratio"] > 0 and len(bound[0]["group_cv_by_epoch"]) == 2
    assert "group_cv_epoch1" in hetero["online"]
