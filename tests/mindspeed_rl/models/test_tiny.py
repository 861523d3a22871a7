"""The tiny Qwen-family models and their character tokenizer, built locally."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from mindspeed_rl.models.tiny import (
    TINY_QWEN3_MOE_ARCH,
    TINY_QWEN3_TIED_ARCH,
    TINY_QWEN25_ARCH,
    TINY_TEST_ARCH,
    UNK_TOKEN_ID,
    build_char_tokenizer,
    config_from_arch,
    create_tiny_model,
    ensure_model,
)
from mindspeed_rl.models.transformers_compat import rope_base

PRINTABLE = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")


def test_tokenizer_round_trips_printable_ascii_exactly() -> None:
    tok = build_char_tokenizer()
    rng = random.Random(0)
    texts = ["  two  spaces ", "\ttab\nnewline\n", "".join(rng.choice(PRINTABLE) for _ in range(400))]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
    assert len(tok) == 102 < 128


def test_special_tokens_are_single_ids() -> None:
    tok = build_char_tokenizer()
    ids = tok("<|im_start|>user\nhi<|im_end|><|endoftext|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 2 and ids[-2:] == [3, 1]
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_any_text_encodes_unknown_characters_become_one_unk_id() -> None:
    tok = build_char_tokenizer()
    ids = tok("x\u2264\u00e9 \\frac{1}{2}", add_special_tokens=False)["input_ids"]
    assert ids[1:3] == [UNK_TOKEN_ID, UNK_TOKEN_ID] and tok.unk_token_id == UNK_TOKEN_ID
    assert tok.decode(ids) == "x<unk><unk> \\frac{1}{2}"
    # The unknown token comes after the characters: every id a model built before it knew is unchanged.
    assert tok.convert_tokens_to_ids(["<pad>", "<|endoftext|>", "\n", "a", "~"]) == [0, 1, 4, 71, 100]


def test_arch_keys_map_to_qwen3_config() -> None:
    cfg = config_from_arch(TINY_TEST_ARCH)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (2, 64, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.tie_word_embeddings) == (128, 512, False)
    assert rope_base(cfg) == 1e6  # rope_parameters in transformers 5.x, rope_theta in 4.x
    no_vocab = {k: v for k, v in TINY_TEST_ARCH.items() if k != "padded_vocab_size"}
    assert config_from_arch({**no_vocab, "make_vocab_size_divisible_by": 64}).vocab_size == 128


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num_experts": 8}, "moe_ffn_hidden_size"),
        ({"num_experts": 8, "moe_ffn_hidden_size": 32, "n_shared_experts": 1}, "shared expert"),
        ({"qk_layernorm": False}, "no Qwen architecture"),
        ({"add_qkv_bias": True, "qk_layernorm": False}, "head_dim from hidden_size"),
        ({"disable_bias_linear": False}, "disable_bias_linear: True"),
        ({"num_query_groups": 3}, "multiple of num_query_groups"),
        ({"num_layer": 2}, r"unknown keys \['num_layer'\]"),
        ({"num_layers": 0}, "missing"),
        ({"padded_vocab_size": 64}, "smaller than the tokenizer"),
    ],
)
def test_bad_architecture_is_rejected(override: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_arch({**TINY_TEST_ARCH, **override})


def test_create_saves_a_loadable_seeded_hf_folder(tmp_path: Path) -> None:
    path = create_tiny_model(tmp_path / "m", TINY_TEST_ARCH, seed=3)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.decode(tok("a b  c")["input_ids"]) == "a b  c"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert model.generation_config.eos_token_id == 1 and model.generation_config.pad_token_id == 0
    again = create_tiny_model(tmp_path / "again", TINY_TEST_ARCH, seed=3)
    other = create_tiny_model(tmp_path / "other", TINY_TEST_ARCH, seed=4)
    weights = [load_file(p / "model.safetensors")["lm_head.weight"] for p in (path, again, other)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
    with pytest.raises(ValueError, match="already exists"):
        create_tiny_model(path, TINY_TEST_ARCH)


def test_ensure_model_creates_once_and_checks_the_architecture(tmp_path: Path) -> None:
    path = ensure_model(tmp_path / "m", TINY_TEST_ARCH)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model(path, TINY_TEST_ARCH) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert AutoConfig.from_pretrained(path).num_hidden_layers == 2
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ensure_model(path, {**TINY_TEST_ARCH, "num_layers": 3})
    (path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="lacks"):
        ensure_model(path, TINY_TEST_ARCH)


def test_family_is_picked_from_the_architecture_keys() -> None:
    tied, qwen25, moe = (
        config_from_arch(a) for a in (TINY_QWEN3_TIED_ARCH, TINY_QWEN25_ARCH, TINY_QWEN3_MOE_ARCH)
    )
    assert (tied.model_type, tied.tie_word_embeddings) == ("qwen3", True)
    assert (qwen25.model_type, qwen25.num_attention_heads, qwen25.hidden_size) == ("qwen2", 2, 64)
    assert (moe.model_type, moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (
        "qwen3_moe",
        4,
        2,
        32,
    )
    assert moe.head_dim == 32 and moe.mlp_only_layers == [] and moe.norm_topk_prob


@pytest.mark.parametrize(
    ("arch", "present", "absent"),
    [
        (TINY_QWEN3_TIED_ARCH, "model.embed_tokens.weight", "lm_head.weight"),
        (TINY_QWEN25_ARCH, "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_norm.weight"),
        (
            TINY_QWEN3_MOE_ARCH,
            "model.layers.1.mlp.experts.3.up_proj.weight",
            "model.layers.0.mlp.experts.gate_up_proj",
        ),
    ],
)
def test_real_checkpoint_shapes_are_saved_in_checkpoint_names(
    tmp_path: Path, arch: dict[str, object], present: str, absent: str
) -> None:
    path = create_tiny_model(tmp_path / "m", arch, seed=0)
    names = set(load_file(path / "model.safetensors"))
    assert present in names and absent not in names
    assert ensure_model(path, arch) == path
    with pytest.raises(ValueError, match="differs"):
        ensure_model(path, TINY_TEST_ARCH)
