"""The run's prompts: the split (training sees only the train part; the eval set is held out)
and the global batches of prompt ids over several passes of the data."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.models.tiny import build_char_tokenizer
from mindspeed_rl.plan.build import DataSpec, build_run_plan
from mindspeed_rl.trainer import prompts

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


# 4 prompts x 8 samples per iteration; every micro-batch setting divides that.
SMALL_BATCH = (
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=8",
    "rl_config.ref_forward_micro_batch_size=8",
    "actor_config.micro_batch_size=8",
)


def _data(*overrides: str) -> DataSpec:
    return build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_cpu", overrides)).data


def test_global_batches_cover_every_prompt_once_per_pass() -> None:
    data = _data(
        *SMALL_BATCH,
        "megatron_training.train_iters=5",
    )
    ids = [f"p{i}" for i in range(10)]
    batches = prompts.global_batches(data, ids)
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    # 20 slots over 10 prompts: exactly two full passes, no prompt twice in one batch.
    assert Counter(pid for b in batches for pid in b) == {pid: 2 for pid in ids}
    assert all(len(set(b)) == len(b) for b in batches)


def test_global_batches_no_shuffle_keeps_dataset_order() -> None:
    data = _data(
        *SMALL_BATCH,
        "megatron_training.train_iters=2",
        "megatron_training.no_shuffle=true",
    )
    assert prompts.global_batches(data, [f"p{i}" for i in range(8)]) == [
        ("p0", "p1", "p2", "p3"),
        ("p4", "p5", "p6", "p7"),
    ]


def test_global_batches_straddling_two_passes_never_repeat_a_prompt() -> None:
    data = _data(
        *SMALL_BATCH,
        "megatron_training.train_iters=30",
    )
    batches = prompts.global_batches(data, [f"p{i}" for i in range(6)])
    assert all(len(set(b)) == 4 for b in batches)


def test_too_few_prompts_is_a_clear_error() -> None:
    data = _data(*SMALL_BATCH)
    with pytest.raises(ValueError, match="global_batch_size"):
        prompts.global_batches(data, ["a", "b"])


def _split_data(*overrides: str) -> DataSpec:
    return _data(*SMALL_BATCH, "megatron_training.train_iters=5", *overrides)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _ids(records) -> set[str]:
    return {r.prompt_id for r in records}


def test_builtin_demo_split_holds_out_valid_prompts_and_still_covers_every_iteration(tokenizer) -> None:
    data = _split_data("megatron_training.split='90,10,0'")
    splits = prompts.load_prompt_splits(data, tokenizer)
    assert len(splits.train) >= 4 * 5 and len(splits.valid) >= 2
    assert not _ids(splits.train) & _ids(splits.valid)
    # The training loader returns exactly the train part, whatever the caller.
    assert _ids(prompts.load_prompt_set(data, tokenizer).records) == _ids(splits.train)


def test_default_split_trains_on_everything(tokenizer) -> None:
    data = _split_data()
    splits = prompts.load_prompt_splits(data, tokenizer)
    assert len(splits.train) == 20 and not splits.valid


def _write(path: Path, rows: list[dict[str, str]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_valid_data_path_is_the_eval_set(tokenizer, tmp_path: Path) -> None:
    valid = _write(
        tmp_path / "valid.jsonl", [{"id": f"v{i}", "prompt": "a*2=", "answer": "aa"} for i in range(3)]
    )
    data = _split_data(f"+megatron_training.valid_data_path={valid}")
    splits = prompts.load_prompt_splits(data, tokenizer)
    assert _ids(splits.valid) == {"v0", "v1", "v2"} and len(splits.train) == 20


def test_valid_data_path_with_a_valid_split_weight_is_an_error(tokenizer, tmp_path: Path) -> None:
    valid = _write(tmp_path / "valid.jsonl", [{"prompt": "a*2=", "answer": "aa"}])
    data = _split_data(f"+megatron_training.valid_data_path={valid}", "megatron_training.split='90,10,0'")
    with pytest.raises(ValueError, match="set split's valid weight to 0"):
        prompts.load_prompt_splits(data, tokenizer)


def test_builtin_valid_data_path_is_refused(tokenizer) -> None:
    data = _split_data("+megatron_training.valid_data_path=builtin:demo")
    with pytest.raises(ValueError, match="repeat the training prompts"):
        prompts.load_prompt_splits(data, tokenizer)
