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
    from mindspeed_rl.datasets import PromptSet
    from mindspeed_rl.models.rollout.base import SamplingConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

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

    The warm-up runs only when the folder is created by this call: re-running a config never
    re-trains an existing model behind the user's back.
    """
    path = model_path(config)
    if path.exists():
        return path
    if not config.rl_config.build_model_if_missing:
        raise ValueError(
            f"model folder {path} does not exist; download/convert an HF checkpoint there, or set "
            "rl_config.build_model_if_missing: true to create a tiny random-init model"
        )
    from mindspeed_rl.models.tiny import create_tiny_model

    logger.info("creating a random-init %s model at %s", config.model_name, path)
    create_tiny_model(path, _arch_mapping(config.model), seed=config.megatron_training.training.seed)
    if config.warmup_config.enabled:
        _run_warmup(config, path)
    return path


def _arch_mapping(arch: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(arch).items() if v is not None}


def _run_warmup(config: GRPOConfig, path: Path) -> None:
    from mindspeed_rl.datasets.demo_task import demo_sft_pairs
    from mindspeed_rl.models.training.sft_warmup import sft_warmup

    data_path = config.megatron_training.training.data_path
    if data_path != "builtin:demo":
        raise ValueError(
            f"warmup_config.enabled needs reference answers; only builtin:demo provides them, got "
            f"data_path={data_path!r}. Disable warmup_config or use builtin:demo"
        )
    import torch

    warm = config.warmup_config
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


def load_tokenizer(path: str | Path) -> Any:
    """The policy's HF tokenizer (local folder only: runs never reach for a hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_prompt_set(config: GRPOConfig, tokenizer: Any) -> PromptSet:
    """Prompts for the run, with drops counted and logged by the loader."""
    from mindspeed_rl.datasets import load_prompts

    training = config.megatron_training.training
    if not training.data_path:
        raise ValueError(
            "megatron_training.data_path is not set; point it at JSONL/Parquet prompts or builtin:demo"
        )
    builtin = training.data_path.startswith("builtin:")
    return load_prompts(
        data_path=training.data_path,
        tokenizer=tokenizer,
        prompt_type=training.prompt_type or "empty",
        map_keys=None if builtin else training.map_keys,
        max_prompt_length=config.rl_config.max_prompt_length,
        # Built-in tasks are generated: enough distinct prompts for every iteration of the run.
        num_samples=config.global_batch_prompts * max(1, training.train_iters) if builtin else None,
        seed=training.seed,
    )


def sampling_config(config: GRPOConfig) -> SamplingConfig:
    from dataclasses import asdict

    from mindspeed_rl.models.rollout.base import sampling_config_from_mapping

    return sampling_config_from_mapping(asdict(config.generate_config.sampling_config))


def torch_engine_config(config: GRPOConfig) -> TorchEngineConfig:
    """Map upstream keys (and their batch-size units) onto the torch training engine."""
    from mindspeed_rl.models.loss.grpo import GRPOLossConfig
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

    actor = config.actor_config
    rl = config.rl_config
    return TorchEngineConfig(
        lr=actor.optimizer.lr,
        weight_decay=actor.optimizer.weight_decay,
        adam_beta1=actor.optimizer.adam_beta1,
        adam_beta2=actor.optimizer.adam_beta2,
        clip_grad=actor.optimizer.clip_grad,
        micro_batch_size=actor.training.micro_batch_size,
        forward_micro_batch_size=rl.actor_forward_micro_batch_size,
        mini_batch_size=config.mini_batch_prompts,
        n_samples_per_prompt=rl.n_samples_per_prompt,
        epochs=rl.epochs,
        shuffle_mini_batch=rl.shuffle_mini_batch,
        loss=GRPOLossConfig(
            clip_ratio=rl.clip_ratio,
            kl_penalty=rl.kl_penalty,
            init_kl_coef=rl.init_kl_coef,
            entropy_coeff=rl.entropy_coeff,
        ),
        seed=config.megatron_training.training.seed,
    )


def generate_config_mapping(config: GRPOConfig) -> dict[str, Any]:
    """``generate_config`` as the rollout factory expects it (engine keys only)."""
    from dataclasses import asdict

    raw = asdict(config.generate_config)
    raw.pop("sampling_config")
    return raw


def global_batches(config: GRPOConfig, prompt_ids: list[str]) -> list[tuple[str, ...]]:
    """``train_iters`` global batches of prompt ids; the data is reshuffled at every pass over it.

    Upstream semantics: ``global_batch_size`` prompts per iteration, seeded shuffling unless
    ``no_shuffle``. Leftover prompts at the end of a pass roll into the next batch instead of being
    dropped.
    """
    import numpy as np

    training = config.megatron_training.training
    size = config.global_batch_prompts
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
