import pytest

from mindspeed_rl.models.training.lr_schedule import LRSchedule


def test_warmup_rises_linearly_to_the_peak() -> None:
    s = LRSchedule(lr=1.0, warmup_steps=4)
    assert [s.lr_at(i) for i in (1, 2, 3, 4, 5, 100)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_decay_ends_at_min_lr_and_stays(style: str) -> None:
    s = LRSchedule(lr=1.0, min_lr=0.1, decay_style=style, warmup_steps=2, decay_steps=10)  # type: ignore[arg-type]
    values = [s.lr_at(i) for i in range(1, 13)]
    assert values[1] == 1.0  # end of warm-up
    assert all(a >= b for a, b in zip(values[1:], values[2:]))  # non-increasing after warm-up
    assert values[9] == pytest.approx(0.1) and values[11] == pytest.approx(0.1)
    midpoint = s.lr_at(6)  # halfway through decay (steps 2..10)
    assert midpoint == pytest.approx(0.55)  # linear and cosine both cross the middle there


def test_cosine_is_flatter_than_linear_early() -> None:
    cos = LRSchedule(lr=1.0, decay_style="cosine", decay_steps=10)
    lin = LRSchedule(lr=1.0, decay_style="linear", decay_steps=10)
    assert cos.lr_at(2) > lin.lr_at(2)


def test_bad_schedules_name_the_keys() -> None:
    with pytest.raises(ValueError, match="lr_decay_iters"):
        LRSchedule(lr=1.0, decay_style="cosine")
    with pytest.raises(ValueError, match="min_lr"):
        LRSchedule(lr=1.0, min_lr=2.0)
    with pytest.raises(ValueError, match="warm-up"):
        LRSchedule(lr=1.0, decay_style="linear", warmup_steps=5, decay_steps=3)
