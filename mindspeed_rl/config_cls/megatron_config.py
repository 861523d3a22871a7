"""The flat Megatron key space shared by ``megatron_training``, ``actor_config``, ``ref_config``,
``reward_config``, ``critic_config`` and the model architecture file.

Upstream merges them as plain dicts (architecture < megatron_training < role section). We keep
the flat keys users write, but parse them into typed groups so code reads
``actor_config.optimizer.lr`` rather than digging in a dict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mindspeed_rl.config_cls.fields import ByEngine, opt
from mindspeed_rl.config_cls.megatron_only import MegatronOnlyKeys, ParallelKeys
from mindspeed_rl.config_cls.megatron_upstream import (
    UnsupportedArchitectureKeys,
    UnsupportedTrainingKeys,
    UpstreamInertKeys,
)
from mindspeed_rl.config_cls.model_arch import ModelArchitecture
from mindspeed_rl.config_cls.parse import Problems, check_keys, field_names, parse_fields


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingKeys:
    """Run, data, checkpoint and precision keys. Batch sizes use upstream's units (see each)."""

    model: str | None = opt(None, "Name of the architecture in `model:` (configs/model/<name>.yaml).")
    tokenizer_type: str = opt(
        "PretrainedFromHF",
        "Tokenizer kind.",
        inert="both engines load the HF tokenizer of tokenizer_name_or_path",
    )
    tokenizer_name_or_path: str | None = opt(
        None,
        "HF model folder: tokenizer and weights (upstream convention). Created when "
        "rl_config.build_model_if_missing and the folder is absent.",
    )
    global_batch_size: int = opt(0, "PROMPTS per training iteration (each expanded x n_samples_per_prompt).")
    micro_batch_size: int = opt(1, "SAMPLES per forward/backward micro-batch of the update.")
    seq_length: int = opt(
        0,
        "Megatron's padded sequence length.",
        inert="both engines pad each micro-batch to its own longest sample",
    )
    variable_seq_lengths: bool = opt(
        False,
        "Megatron variable-length batches.",
        inert=ByEngine(
            torch="the torch engine pads each micro-batch to its own longest sample",
            megatron="the megatron engine sets it itself: on with pipeline stages (PP > 1), so each "
            "micro-batch keeps its own width",
        ),
    )
    train_iters: int = opt(0, "Training iterations (one global batch each).")
    save_interval: int | None = opt(None, "Iterations between checkpoints; null = only at the end.")
    eval_interval: int | None = opt(None, "Iterations between evaluations; null = none.")
    eval_iters: int = opt(0, "Evaluation batches per evaluation.")
    log_interval: int = opt(1, "Iterations between console log lines.")
    stage: str | None = opt(
        None,
        "Upstream stage tag (ray_grpo).",
        refused=(
            "this stage is not supported: GRPO and DAPO train here (ray_grpo; ray_dapo = GRPO with "
            "rl_config's clip-higher, token-level loss, overlong penalty and filter_groups keys), while "
            "ray_ppo is PPO with a critic, dpo is DPO, and sft or "
            "reward-model stages train other objectives"
        ),
        accepts=("ray_grpo", "ray_dapo"),
        inert="informational; rl_config.pipeline picks the loop",
    )
    seed: int = opt(1234, "Global seed (data order, init, sampling).")
    data_path: str | None = opt(
        None, "JSONL/Parquet file or folder, or builtin:<task> (e.g. builtin:demo) for generated tasks."
    )
    valid_data_path: str | None = opt(
        None,
        "JSONL/Parquet prompts for periodic evaluation (eval_interval), read like data_path; "
        "when set, split's valid weight must be 0.",
    )
    map_keys: Mapping[str, str] | None = opt(
        None, "Raw JSONL/Parquet: column per role, e.g. {prompt: problem, labels: answer}."
    )
    prompt_type: str | None = opt(None, "Chat template name (qwen_r1, qwen3, empty, ...).")
    split: str = opt(
        "100,0,0", "train,valid,test weights; train trains, valid is the eval set, test stays unused."
    )
    no_shuffle: bool = opt(False, "Keep dataset order (no shuffling).")
    full_shuffle_instruction_dataset: bool = opt(
        False,
        "Shuffle across epochs of the dataset too.",
        inert="every pass over the prompts is reshuffled (seeded) already, unless no_shuffle",
    )
    is_instruction_dataset: bool = opt(
        True,
        "Upstream dataset kind flag.",
        inert="prompts are always instructions (prompt_type's chat template is applied)",
    )
    dataset_additional_keys: tuple[str, ...] = opt((), "Extra dataset columns carried (e.g. labels).")
    bf16: bool = opt(
        False,
        "bf16 parameters with fp32 master weights, fp32 grad accumulation and fp32 optimizer state, on "
        "every device (CPU too: the tiny CPU configs keep false so log-probs match the fp32 rollout).",
    )
    fp16: bool = opt(False, "Train in float16: not implemented by the torch engine (needs loss scaling).")
    load: str | None = opt(
        None,
        "Without finetune: resume from the newest complete checkpoint in this folder (a save folder). "
        "With finetune: true: the HF folder the policy and reference start from.",
    )
    save: str | None = opt(
        None, "Folder of the periodic checkpoints (iter_<N>/, HF-loadable); null = <run dir>/checkpoints."
    )
    finetune: bool = opt(False, "With load: weights only, iteration count and optimizer start fresh.")
    no_load_optim: bool = opt(False, "Resume with fresh optimizer state (AdamW moments).")
    no_load_rng: bool = opt(False, "Resume without restoring the RNG states.")
    no_save_optim: bool = opt(False, "Checkpoints leave out the optimizer state.")
    no_save_rng: bool = opt(False, "Checkpoints leave out the RNG states.")
    attention_dropout: float = opt(0.0, "Attention dropout (RL: keep 0).")
    hidden_dropout: float = opt(0.0, "Hidden dropout (RL: keep 0).")
    init_method_std: float = opt(0.02, "Weight init std for a freshly built model.")


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerKeys:
    """Adam/SGD and LR schedule."""

    optimizer: Literal["adam", "sgd"] = opt("adam", "Optimizer (adam = AdamW with weight_decay).")
    lr: float = opt(1e-6, "Peak learning rate.")
    min_lr: float = opt(0.0, "Floor of the decay schedule.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = opt("constant", "LR decay after warm-up.")
    lr_decay_iters: int | None = opt(
        None,
        "OPTIMIZER STEPS of decay (Megatron's unit); null = the whole run = train_iters x "
        "(global_batch_size / mini_batch_size x epochs) steps.",
    )
    lr_warmup_fraction: float | None = opt(None, "Linear warm-up as a fraction of the decay steps.")
    lr_warmup_iters: int = opt(0, "Linear warm-up in OPTIMIZER STEPS (when lr_warmup_fraction is null).")
    weight_decay: float = opt(0.01, "Decoupled weight decay.")
    clip_grad: float = opt(1.0, "Global gradient-norm clip; 0 = off.")
    adam_beta1: float = opt(0.9, "Adam beta1.")
    adam_beta2: float = opt(0.999, "Adam beta2.")
    adam_eps: float = opt(1e-8, "Adam epsilon.")


_GROUPS: dict[str, type] = {
    "arch": ModelArchitecture,
    "training": TrainingKeys,
    "optimizer": OptimizerKeys,
    "parallel": ParallelKeys,
    "megatron_only": MegatronOnlyKeys,
    "unsupported_arch": UnsupportedArchitectureKeys,
    "unsupported_training": UnsupportedTrainingKeys,
    "upstream_inert": UpstreamInertKeys,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronConfig:
    """One role's resolved keys: architecture < megatron_training < role section."""

    arch: ModelArchitecture = dataclasses.field(default_factory=ModelArchitecture)
    training: TrainingKeys = dataclasses.field(default_factory=TrainingKeys)
    optimizer: OptimizerKeys = dataclasses.field(default_factory=OptimizerKeys)
    parallel: ParallelKeys = dataclasses.field(default_factory=ParallelKeys)
    megatron_only: MegatronOnlyKeys = dataclasses.field(default_factory=MegatronOnlyKeys)
    unsupported_arch: UnsupportedArchitectureKeys = dataclasses.field(
        default_factory=UnsupportedArchitectureKeys
    )
    unsupported_training: UnsupportedTrainingKeys = dataclasses.field(default_factory=UnsupportedTrainingKeys)
    upstream_inert: UpstreamInertKeys = dataclasses.field(default_factory=UpstreamInertKeys)

    def to_flat_dict(self) -> dict[str, Any]:
        """Flat keys as users write them (groups are our internal organisation)."""
        flat: dict[str, Any] = {}
        for name in _GROUPS:
            group = getattr(self, name)
            flat.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
        return flat


def _key_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for group_name, cls in _GROUPS.items():
        for key in field_names(cls):
            assert key not in index, f"Megatron key {key} declared in two groups"
            index[key] = group_name
    return index


MEGATRON_KEY_GROUP: Mapping[str, str] = _key_index()
MEGATRON_KEYS: frozenset[str] = frozenset(MEGATRON_KEY_GROUP)
MEGATRON_FIELDS: Mapping[str, dataclasses.Field[Any]] = {
    f.name: f for cls in _GROUPS.values() for f in dataclasses.fields(cls)
}


def build_megatron_config(
    layers: Sequence[tuple[str, Any]], problems: Problems
) -> tuple[MegatronConfig, dict[str, str]]:
    """Merge ``(section_name, mapping)`` layers, later overriding earlier, into typed groups.

    Returns the config and, per key, the section its value came from (for error messages and
    inert-key reports).
    """
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for section_name, raw in layers:
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            problems.add(section_name, "expected a mapping of keys")
            continue
        check_keys(raw, MEGATRON_KEYS, section_name, problems)
        for key, value in raw.items():
            if key in MEGATRON_KEYS:
                merged[key] = value
                origin[key] = section_name
    groups: dict[str, Any] = {
        name: parse_fields(cls, merged, problems, lambda key: f"{origin[key]}.{key}")
        for name, cls in _GROUPS.items()
    }
    return MegatronConfig(**groups), origin
