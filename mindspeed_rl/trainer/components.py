"""Turn a typed ``GRPOConfig`` into the building blocks both pipelines share.

Pure construction helpers: no Ray, no loops. The trainers (``grpo_trainer_hybrid`` /
``grpo_trainer_async``) and the workers call these so that the two pipelines cannot drift apart
in how they read the config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindspeed_rl.config_cls import GRPOConfig
    from mindspeed_rl.datasets import PromptRecord, PromptSet
    from mindspeed_rl.datasets.split import PromptSplits
    from mindspeed_rl.plan.sections import WarmupSpec

from mindspeed_rl.models.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def model_path(config: GRPOConfig) -> Path:
    """The HF folder holding tokenizer + weights (upstream: ``tokenizer_name_or_path``)."""
    path = config.megatron_training.training.tokenizer_name_or_path
    if not path:
        raise ValueError(
            "megatron_training.tokenizer_name_or_path is not set; point it at an HF model folder "
            "(or set rl_config.build_model_if_missing: true with a `model:` architecture)"
        )
    return Path(path)


def prepare_policy_model(config: GRPOConfig) -> Path:
    """Return the policy folder, creating (and warming up) a fresh model there if asked to.

    ``load`` with ``finetune: true`` (``RunPlan.model.initial_weights``) replaces the folder: an
    HF checkpoint such as one this framework saved (weights and tokenizer files together). The
    warm-up runs only when the folder is created by this call: re-running a config never
    re-trains an existing model behind the user's back.
    """
    from mindspeed_rl.plan.build import model_spec
    from mindspeed_rl.plan.sections import warmup_spec

    spec = model_spec(config)
    if spec.initial_weights is not None:
        initial = Path(spec.initial_weights)
        if not (initial / "config.json").is_file():
            raise ValueError(
                f"actor_config.load={initial} (finetune: true) is not an HF model folder (no config.json); "
                "point it at a saved checkpoint, e.g. <run dir>/final_model"
            )
        return initial
    path = Path(spec.path)
    if path.exists():
        return path
    if not spec.build_if_missing:
        raise ValueError(
            f"model folder {path} does not exist; download/convert an HF checkpoint there, or set "
            "rl_config.build_model_if_missing: true to create a tiny random-init model"
        )
    from mindspeed_rl.models.tiny import create_tiny_model

    logger.info("creating a random-init %s model at %s", spec.name, path)
    create_tiny_model(path, dict(spec.build_arch), seed=spec.build_seed)
    warmup = warmup_spec(config)
    if warmup is not None:
        _run_warmup(warmup, path)
    return path


def _run_warmup(warm: WarmupSpec, path: Path) -> None:
    import torch

    from mindspeed_rl.datasets.demo_task import demo_sft_pairs
    from mindspeed_rl.models.training.sft_warmup import sft_warmup

    # The tiny model's matmuls are far too small to amortise a second OpenMP thread, and spinning
    # threads collapse throughput when the cores are shared (measured: >10x slower with 2).
    torch.set_num_threads(1)
    stats = sft_warmup(
        path,
        load_tokenizer(path),
        demo_sft_pairs(warm.num_examples, warm.seed),
        steps=warm.steps,
        lr=warm.lr,
        batch_size=warm.batch_size,
        seed=warm.seed,
    )
    logger.info("SFT warm-up: %s", {k: round(v, 4) for k, v in stats.items()})


def load_prompt_set(config: GRPOConfig, tokenizer: Any) -> PromptSet:
    """The TRAIN prompts of the run (``split``'s held-out parts removed), drops counted and logged."""
    from mindspeed_rl.datasets import PromptSet
    from mindspeed_rl.datasets.split import split_prompts

    training = config.megatron_training.training
    loaded = _load_data_path(config, tokenizer)
    train = split_prompts(loaded.records, training.split, training.seed).train
    return PromptSet(records=list(train), drops=loaded.drops)


def load_prompt_splits(config: GRPOConfig, tokenizer: Any) -> PromptSplits:
    """Train / valid / test prompts: ``split`` applied to ``data_path``, or, when
    ``valid_data_path`` is set, that file as the valid part (``split``'s valid weight must be 0:
    two eval sets at once would be ambiguous). Training must only ever see ``.train``."""
    import dataclasses

    from mindspeed_rl.datasets.split import parse_split, split_prompts

    training = config.megatron_training.training
    weights = parse_split(training.split)
    valid_path = training.valid_data_path
    if valid_path and weights.valid > 0:
        raise ValueError(
            f"megatron_training.valid_data_path={valid_path!r} and split={training.split!r} both "
            "define an eval set; set split's valid weight to 0 (e.g. '100,0,0') or remove valid_data_path"
        )
    splits = split_prompts(_load_data_path(config, tokenizer).records, training.split, training.seed)
    if not valid_path:
        return splits
    valid = _load_valid_path(config, tokenizer, valid_path)
    shared = {r.prompt_id for r in splits.train} & {r.prompt_id for r in valid}
    if shared:
        raise ValueError(
            f"valid_data_path shares {len(shared)} prompt ids with data_path (e.g. {sorted(shared)[:3]}); "
            "evaluation prompts must be held out from training: use a disjoint file or split"
        )
    return dataclasses.replace(splits, valid=valid)


def _load_data_path(config: GRPOConfig, tokenizer: Any) -> PromptSet:
    from mindspeed_rl.datasets import load_prompts
    from mindspeed_rl.datasets.split import parse_split, prompts_to_generate

    training = config.megatron_training.training
    if not training.data_path:
        raise ValueError(
            "megatron_training.data_path is not set; point it at JSONL/Parquet prompts or builtin:demo"
        )
    builtin = training.data_path.startswith("builtin:")
    # Built-in tasks are generated: enough distinct prompts that the train part of the split
    # covers every iteration of the run.
    num_train = config.num_prompts_per_global_batch * max(1, training.train_iters)
    return load_prompts(
        data_path=training.data_path,
        tokenizer=tokenizer,
        prompt_type=training.prompt_type or "empty",
        map_keys=None if builtin else training.map_keys,
        max_prompt_length=config.rl_config.max_prompt_length,
        num_samples=prompts_to_generate(num_train, parse_split(training.split)) if builtin else None,
        seed=training.seed,
    )


def _load_valid_path(config: GRPOConfig, tokenizer: Any, valid_path: str) -> tuple[PromptRecord, ...]:
    from mindspeed_rl.datasets import load_prompts

    training = config.megatron_training.training
    if valid_path.startswith("builtin:"):
        raise ValueError(
            f"megatron_training.valid_data_path={valid_path!r}: built-in tasks are generated from the "
            "run seed, so they would repeat the training prompts; hold prompts out with split instead, "
            "e.g. split: '90,10,0'"
        )
    loaded = load_prompts(
        data_path=valid_path,
        tokenizer=tokenizer,
        prompt_type=training.prompt_type or "empty",
        map_keys=training.map_keys,
        max_prompt_length=config.rl_config.max_prompt_length,
        seed=training.seed,
    )
    return tuple(loaded.records)


def global_batches(config: GRPOConfig, prompt_ids: list[str]) -> list[tuple[str, ...]]:
    """``train_iters`` global batches of prompt ids; the data is reshuffled at every pass over it.

    Upstream semantics: ``global_batch_size`` prompts per iteration, seeded shuffling unless
    ``no_shuffle``. Leftover prompts at the end of a pass roll into the next batch instead of being
    dropped.
    """
    import numpy as np

    training = config.megatron_training.training
    size = config.num_prompts_per_global_batch
    if len(prompt_ids) < size:
        raise ValueError(
            f"only {len(prompt_ids)} prompts survived loading but global_batch_size is {size}; "
            "add data, raise max_prompt_length, or lower megatron_training.global_batch_size"
        )
    rng = np.random.default_rng(training.seed)
    stream: list[str] = []
    batches: list[tuple[str, ...]] = []
    while len(batches) < training.train_iters:
        if len(stream) < size:
            order = [
                prompt_ids[i]
                for i in (
                    np.arange(len(prompt_ids)) if training.no_shuffle else rng.permutation(len(prompt_ids))
                )
            ]
            # Prompts still pending from the last pass go to the END of the new pass, so the batch
            # that straddles two passes never holds the same prompt twice.
            pending = set(stream)
            stream.extend(
                [pid for pid in order if pid not in pending] + [pid for pid in order if pid in pending]
            )
        batches.append(tuple(stream[:size]))
        stream = stream[size:]
    return batches
