"""load_prompt_splits / load_prompt_set: training sees only the train part; the eval set is held out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.models.tiny import build_char_tokenizer
from mindspeed_rl.trainer import components

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SMALL = (
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=8",
    "rl_config.ref_forward_micro_batch_size=8",
    "actor_config.micro_batch_size=8",
    "megatron_training.train_iters=5",
)


def _config(*overrides: str):
    return load_config_from_files(CONFIGS, "grpo_tiny_cpu", (*SMALL, *overrides))


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _ids(records) -> set[str]:
    return {r.prompt_id for r in records}


def test_builtin_demo_split_holds_out_valid_prompts_and_still_covers_every_iteration(tokenizer) -> None:
    config = _config("megatron_training.split='90,10,0'")
    splits = components.load_prompt_splits(config, tokenizer)
    assert len(splits.train) >= 4 * 5 and len(splits.valid) >= 2
    assert not _ids(splits.train) & _ids(splits.valid)
    # The training loader returns exactly the train part, whatever the caller.
    assert _ids(components.load_prompt_set(config, tokenizer).records) == _ids(splits.train)


def test_default_split_trains_on_everything(tokenizer) -> None:
    config = _config()
    splits = components.load_prompt_splits(config, tokenizer)
    assert len(splits.train) == 20 and not splits.valid


def _write(path: Path, rows: list[dict[str, str]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_valid_data_path_is_the_eval_set(tokenizer, tmp_path: Path) -> None:
    valid = _write(
        tmp_path / "valid.jsonl", [{"id": f"v{i}", "prompt": "a*2=", "answer": "aa"} for i in range(3)]
    )
    config = _config(f"+megatron_training.valid_data_path={valid}")
    splits = components.load_prompt_splits(config, tokenizer)
    assert _ids(splits.valid) == {"v0", "v1", "v2"} and len(splits.train) == 20


def test_valid_data_path_with_a_valid_split_weight_is_an_error(tokenizer, tmp_path: Path) -> None:
    valid = _write(tmp_path / "valid.jsonl", [{"prompt": "a*2=", "answer": "aa"}])
    config = _config(f"+megatron_training.valid_data_path={valid}", "megatron_training.split='90,10,0'")
    with pytest.raises(ValueError, match="set split's valid weight to 0"):
        components.load_prompt_splits(config, tokenizer)


def test_builtin_valid_data_path_is_refused(tokenizer) -> None:
    config = _config("+megatron_training.valid_data_path=builtin:demo")
    with pytest.raises(ValueError, match="repeat the training prompts"):
        components.load_prompt_splits(config, tokenizer)
