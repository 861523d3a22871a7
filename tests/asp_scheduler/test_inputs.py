import numpy as np
import pytest

from asp_scheduler.jsonl import read_length_pairs
from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions, noisy_oracle_with_nu
from asp_scheduler.schedule import Schedule, fixed_order_schedule


def test_length_pairs_keep_repeats_and_optional_texts(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt_id": "a", "length": 5, "prompt": "x"}\n\n{"prompt_id": 7, "length": 2.5}\n'
                    '{"prompt_id": "a", "length": 9, "prompt": "x"}\n')  # fmt: skip
    assert read_length_pairs(path) == [("a", "x", 5.0), ("7", None, 2.5), ("a", "x", 9.0)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt_id": "a"}', "field 'length' is missing"),
        ('{"prompt_id": "a", "length": "long"}', "must be numbers > 0"),
        ('{"prompt_id": "a", "length": 0}', "must be numbers > 0"),
        ('{"length": 3}', "field 'prompt_id' is missing"),
    ],
)
def test_length_pairs_reject_bad_rows_with_the_line(tmp_path, line, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=f"pairs.jsonl:1: .*{message}"):
        read_length_pairs(path)


def test_fixed_nu_oracle_uses_the_same_noise_as_the_tau_search():
    lengths = np.random.default_rng(0).lognormal(7, 1, 400)
    searched = noisy_oracle_predictions(lengths, 0.5, seed=3)
    fixed = noisy_oracle_with_nu(lengths, searched.nu, seed=3)
    np.testing.assert_allclose(fixed.predictions, searched.predictions)
    assert fixed.measured_tau == pytest.approx(searched.measured_tau)
    with pytest.raises(ValueError, match="noise_sigma"):
        noisy_oracle_with_nu(lengths, -1.0, seed=0)


def test_fixed_order_schedule_is_c0_and_round_trips(tmp_path):
    s = fixed_order_schedule(np.arange(1.0, 11.0), b=4, k=2, item_ids=[f"i{n}" for n in range(10)])
    assert [m.tolist() for m in s.minibatches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert s.batch_group_ids.tolist() == [0, 0, 1] and s.num_short_minibatches == 1
    s.save(tmp_path / "c0.json")
    again = Schedule.load(tmp_path / "c0.json")
    assert [m.tolist() for m in again.minibatches] == [m.tolist() for m in s.minibatches]
    assert again.params == s.params
