"""Key spellings as upstream accepts them: ``min-lr`` is ``min_lr`` in every section (upstream's
config classes turn '-' into '_' before looking a key up); a key given both ways is an error
naming both spellings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli import check_config
from mindspeed_rl.config_cls import ConfigError, load_config, load_config_from_files

RECIPES = Path(__file__).with_name("upstream_recipes")


def _hyphenate(text: str, keys: dict[str, str]) -> str:
    """Respell ``  key:`` lines of an upstream-shaped YAML (each given key must be present)."""
    for key, section in keys.items():
        old = f"\n{section}{key}:"
        assert old in text, old
        text = text.replace(old, f"\n{section}{key.replace('_', '-')}:")
    return text


# key -> the indentation it has in grpo_qwen3_8b_A3.yaml (every kind of section is covered: the
# model file, megatron_training, actor_config, rl_config and its nested actor_resource,
# generate_config and its nested sampling_config).
RESPELT = {
    "min_lr": "  ",
    "lr_decay_style": "  ",
    "global_batch_size": "  ",
    "n_samples_per_prompt": "  ",
    "actor_forward_micro_batch_size": "  ",
    "num_npus": "    ",
    "max_num_seqs": "  ",
    "max_tokens": "    ",
}


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    shutil.copytree(RECIPES / "model", tmp_path / "model")
    shutil.copy(RECIPES / "grpo_qwen3_8b_A3.yaml", tmp_path)
    return tmp_path


def test_hyphenated_keys_in_every_section_are_the_underscored_keys(recipe_dir: Path) -> None:
    plain = load_config_from_files(recipe_dir, "grpo_qwen3_8b_A3")
    text = (recipe_dir / "grpo_qwen3_8b_A3.yaml").read_text()
    (recipe_dir / "hyphens.yaml").write_text(_hyphenate(text, RESPELT))
    model = recipe_dir / "model" / "qwen3_8b.yaml"
    model.write_text(_hyphenate(model.read_text(), {"num_attention_heads": "  ", "rotary_base": "  "}))
    respelt = load_config_from_files(recipe_dir, "hyphens")
    assert respelt.to_dict() == plain.to_dict()
    assert respelt.inert_keys == plain.inert_keys
    assert respelt.actor_config.optimizer.min_lr == 0.0 and respelt.model.num_attention_heads == 32
    assert respelt.generate_config.sampling_config.max_tokens == 6144


def test_upstream_dpo_recipes_min_lr_spelling_is_not_an_unknown_key(
    recipe_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # upstream's dpo_qwen3_30b_a3b_A3.yaml writes `min-lr: 0` in megatron_training.
    text = (recipe_dir / "grpo_qwen3_8b_A3.yaml").read_text()
    text = text.replace("  seed: 7\n", "  seed: 7\n  min-lr: 1.0e-7\n")
    (recipe_dir / "mlr.yaml").write_text(text)
    code = check_config.main(["--config-dir", str(recipe_dir), "--config-name", "mlr"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"min_lr": 1e-07' in out and "unknown key" not in err
    # actor_config's min_lr still overrides megatron_training's, whichever way either is spelt.
    config = load_config_from_files(recipe_dir, "mlr")
    assert config.megatron_training.optimizer.min_lr == 1e-7 and config.actor_config.optimizer.min_lr == 0.0


@pytest.mark.parametrize(
    ("section", "keys"),
    [
        ("actor_config", {"min_lr": 0.0, "min-lr": 1e-7}),
        ("rl_config", {"n-samples-per-prompt": 4, "n_samples_per_prompt": 8}),
        ("generate_config", {"sampling_config": {"max_tokens": 8, "max-tokens": 16}}),
    ],
)
def test_a_key_given_both_ways_is_an_error_naming_both(section: str, keys: dict[str, object]) -> None:
    raw: dict[str, object] = {
        "model": {"toy": {"num_layers": 2, "hidden_size": 32}},
        "megatron_training": {"model": "toy", "global_batch_size": 4, "train_iters": 1},
        "rl_config": {"verifier_function": ["demo"], "verifier_weight": [1.0]},
    }
    raw[section] = {**raw.get(section, {}), **keys}  # type: ignore[dict-item]
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    spelt = keys if section != "generate_config" else keys["sampling_config"]  # type: ignore[assignment]
    first, second = list(spelt)
    assert f"'{first}' and '{second}' are the same key" in str(info.value)


def test_user_named_keys_keep_their_hyphens() -> None:
    # map_keys maps roles to the dataset's own column names; a model name is the user's too.
    raw = {
        "model": {"toy-2": {"num-layers": 2, "hidden_size": 32}},
        "megatron_training": {
            "model": "toy-2", "global_batch_size": 4, "train_iters": 1, "data_path": "builtin:demo",
            "tokenizer_name_or_path": "./toy", "map_keys": {"prompt": "problem-text", "labels": "final-answer"},
        },
        "rl_config": {"n_samples_per_prompt": 2, "verifier_function": ["demo"], "verifier_weight": [1.0]},
    }  # fmt: skip
    config = load_config(raw)
    assert config.model_name == "toy-2" and config.model.num_layers == 2
    assert dict(config.megatron_training.training.map_keys or {}) == {
        "prompt": "problem-text",
        "labels": "final-answer",
    }
