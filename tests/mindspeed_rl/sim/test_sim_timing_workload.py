"""Decode/train models, profile parsing, and workloads from traces or synthetic draws."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mindspeed_rl.sim.timing import DecodeModel, TimingProfile, TrainModel
from mindspeed_rl.sim.workload import SyntheticWorkload, load_trace


def test_minibatch_time_equals_the_step_by_step_sum_over_active_sequences() -> None:
    model = DecodeModel(per_step_seconds=0.5, per_token_seconds=0.01, per_minibatch_seconds=2.0)
    lengths = np.array([3, 7, 7, 1, 12])
    by_steps = 2.0 + sum(model.step_seconds(int((lengths >= s).sum())) for s in range(1, lengths.max() + 1))
    assert model.minibatch_seconds(lengths) == pytest.approx(by_steps)
    # closed form: c + a * L_max + b * sum(L) = 2 + 0.5 * 12 + 0.01 * 30
    assert model.minibatch_seconds(lengths) == pytest.approx(8.3)


def test_train_model_and_validation() -> None:
    assert TrainModel(per_step_seconds=10.0, per_token_seconds=0.5).step_seconds(4) == 12.0
    with pytest.raises(ValueError, match="per_step_seconds"):
        DecodeModel(per_step_seconds=-1.0, per_token_seconds=0.0)
    with pytest.raises(ValueError, match="must take time"):
        TrainModel(per_step_seconds=0.0)


def test_profile_from_mapping_rejects_unknown_keys() -> None:
    good = {
        "decode": {"per_step_seconds": 0.1, "per_token_seconds": 0.0},
        "train": {"per_step_seconds": 5},
        "weight_flow": {"save_seconds": 1, "convert_seconds": 2, "load_seconds": 3},
    }
    profile = TimingProfile.from_mapping(good)
    assert profile.weight_flow.delay_seconds == 6.0
    with pytest.raises(ValueError, match="per_stp_seconds"):
        TimingProfile.from_mapping({**good, "train": {"per_stp_seconds": 5}})
    with pytest.raises(ValueError, match="weight_flow"):
        TimingProfile.from_mapping({k: v for k, v in good.items() if k != "weight_flow"})


def _trace(tmp_path: Path, rows: list[tuple[str, int]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": p, "response_tokens": n}) + "\n" for p, n in rows))
    return path


def test_trace_groups_samples_by_prompt_and_scales(tmp_path: Path) -> None:
    path = _trace(tmp_path, [("a", 100), ("b", 40), ("a", 300), ("b", 7)])
    wl = load_trace(path, scale=0.1)
    assert wl.prompt_ids == ("a", "b")
    assert wl.lengths.tolist() == [[10, 30], [4, 1]]  # 0.7 rounds to 1: never a zero-length response
    assert wl.prompt_lengths.tolist() == [20.0, 2.5]
    flat = load_trace(path, group_by_prompt=False)
    assert flat.num_samples_per_prompt == 1 and flat.num_prompts == 4


def test_trace_with_uneven_sample_counts_is_an_error(tmp_path: Path) -> None:
    path = _trace(tmp_path, [("a", 100), ("b", 40), ("a", 300)])
    with pytest.raises(ValueError, match="rows-as-prompts"):
        load_trace(path)


def test_synthetic_workload_is_deterministic_and_clipped() -> None:
    spec = SyntheticWorkload(num_prompts=50, num_samples_per_prompt=3, median_tokens=500, max_tokens=800)
    a, b, c = spec.draw(1), spec.draw(1), spec.draw(2)
    assert np.array_equal(a.lengths, b.lengths) and not np.array_equal(a.lengths, c.lengths)
    assert a.lengths.shape == (50, 3) and a.lengths.max() <= 800 and a.lengths.min() >= 1
