"""split_prompts: Megatron's train,valid,test weights -> disjoint, deterministic, sized parts."""

from __future__ import annotations

import pytest

from mindspeed_rl.datasets.records import PromptRecord
from mindspeed_rl.datasets.split import parse_split, part_sizes, prompts_to_generate, split_prompts


def _records(num: int) -> list[PromptRecord]:
    return [PromptRecord(prompt_id=f"p{i}", text=f"q{i}", token_ids=(i,), label=str(i)) for i in range(num)]


def _ids(records) -> list[str]:
    return [r.prompt_id for r in records]


def test_parts_are_disjoint_cover_the_data_and_have_the_requested_sizes() -> None:
    records = _records(200)
    splits = split_prompts(records, "90,5,5", seed=3)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (180, 10, 10)
    train, valid, test = set(_ids(splits.train)), set(_ids(splits.valid)), set(_ids(splits.test))
    assert not (train & valid or train & test or valid & test)
    assert train | valid | test == set(_ids(records))
    # Inside a part, source order is kept.
    assert _ids(splits.valid) == sorted(_ids(splits.valid), key=lambda pid: int(pid[1:]))


def test_the_split_is_deterministic_in_the_seed_and_changes_with_it() -> None:
    records = _records(100)
    first = split_prompts(records, "80,20,0", seed=1)
    assert split_prompts(records, "80,20,0", seed=1) == first
    assert _ids(split_prompts(records, "80,20,0", seed=2).valid) != _ids(first.valid)
    # Held-out prompts are drawn from the whole set, not the tail of the file.
    assert max(int(pid[1:]) for pid in _ids(first.valid)) - min(int(p[1:]) for p in _ids(first.valid)) > 50


def test_weights_are_proportions_and_the_default_holds_nothing_out() -> None:
    assert part_sizes(1000, parse_split("969,30,1")) == (969, 30, 1)
    assert part_sizes(10, parse_split("1,1,0")) == (5, 5, 0)
    splits = split_prompts(_records(7), "100,0,0", seed=0)
    assert _ids(splits.train) == _ids(_records(7)) and not splits.valid and not splits.test


@pytest.mark.parametrize(
    ("split", "match"),
    [
        ("90,10", "has 2 value"),
        ("90,ten,0", "non-number"),
        ("0,0,0", "nothing to train on"),
        ("0,100,0", "nothing to train on"),
        ("90,-10,20", ">= 0"),
        ("90,nan,0", ">= 0"),
    ],
)
def test_malformed_split_strings_name_the_problem(split: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        split_prompts(_records(10), split, seed=0)


@pytest.mark.parametrize(
    ("num_train", "split"), [(320, "90,10,0"), (7, "1,1,1"), (64, "969,30,1"), (5, "100,0,0")]
)
def test_prompts_to_generate_leaves_enough_for_training(num_train: int, split: str) -> None:
    weights = parse_split(split)
    num = prompts_to_generate(num_train, weights)
    assert part_sizes(num, weights)[0] >= num_train
    assert num <= num_train / weights.train_fraction + 2  # not wastefully many


def test_the_same_prompt_under_two_ids_never_straddles_train_and_valid() -> None:
    # 40 distinct prompts, each present twice under different ids (as generated tasks can be).
    records = [
        PromptRecord(prompt_id=f"{copy}-{i}", text=f"q{i}", token_ids=(1, i + 2), label="")
        for copy in "ab"
        for i in range(40)
    ]
    splits = split_prompts(records, "50,50,0", seed=3)
    train_texts = {r.token_ids for r in splits.train}
    assert train_texts and all(r.token_ids not in train_texts for r in splits.valid)
    assert len(splits.train) + len(splits.valid) == 80 and len(splits.valid) == 40
