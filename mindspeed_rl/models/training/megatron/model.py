"""Build a megatron-core GPTModel (local layer spec) from an HF config and load this rank's shard.

Requires ``torch.distributed`` to be initialised by the caller (the worker group, torchrun or a
test's spawn); :func:`init_model_parallel` then sets up megatron's TP/PP/EP/DP groups once.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.megatron.hf_mapping import (
    GPTDims,
    SafetensorsSource,
    ShardCoords,
    TensorSource,
    is_weight_name,
    megatron_shard,
)
from mindspeed_rl.models.training.megatron.layout import MegatronLayout

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def init_model_parallel(layout: MegatronLayout, seed: int) -> None:
    """Create megatron's process groups for ``layout`` (idempotent for the same layout)."""
    if not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialised; the megatron engine runs inside a worker group "
            "(mindspeed_rl.workers.training_group) or under torchrun, one process per rank"
        )
    patches.import_megatron()
    patches.patch_current_device()
    from megatron.core import parallel_state as ps

    layout.data_parallel_size(dist.get_world_size())
    if ps.model_parallel_is_initialized():
        current = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        wanted = (layout.tensor_model_parallel_size, layout.pipeline_model_parallel_size)
        if current != wanted:
            raise ValueError(f"megatron is already initialised with (tp, pp)={current}, not {wanted}")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor_model_parallel_size,
            pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
            expert_model_parallel_size=layout.expert_model_parallel_size,
            expert_tensor_parallel_size=layout.expert_tensor_parallel_size,
        )
    patches.seed_model_parallel_rng(seed)


def rank_coords(layout: MegatronLayout) -> ShardCoords:
    """This process's coordinates, read from megatron's parallel state."""
    from megatron.core import parallel_state as ps

    return ShardCoords(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=ps.get_tensor_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        ep_size=ps.get_expert_model_parallel_world_size(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        etp_size=ps.get_expert_tensor_parallel_world_size(),
        make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by,
    )


def _moe_settings(dims: GPTDims, *, cpu: bool) -> dict[str, Any]:
    if not dims.is_moe:
        return {}
    return {
        "num_moe_experts": dims.num_experts,
        "moe_router_topk": dims.moe_topk,
        "moe_ffn_hidden_size": dims.moe_ffn_hidden_size,
        # Qwen3-MoE softmaxes over all experts, then takes the top k; renormalising the k weights
        # (norm_topk_prob) equals megatron's top-k-then-softmax.
        "moe_router_pre_softmax": not dims.norm_topk_prob,
        # alltoall creates a CUDA stream in its constructor.
        "moe_token_dispatcher_type": "allgather" if cpu else "alltoall",
        # The GRPO objective has no load-balancing term (as in the torch engine).
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": not cpu,
    }


def transformer_config(dims: GPTDims, layout: MegatronLayout, *, param_dtype: str) -> Any:
    """Megatron's TransformerConfig for ``dims``: every fusion off on CPU, dropout off (RL)."""
    from megatron.core.transformer import TransformerConfig

    dtype = _DTYPES[param_dtype]
    cpu = patches.on_cpu()
    if cpu and dims.is_moe and layout.tensor_model_parallel_size > 1:
        # MoELayer.forward refuses TP > 1 in training without sequence parallelism, and the local
        # spec's torch RMSNorm refuses sequence parallelism (it needs TransformerEngine's norm).
        raise ValueError(
            "a MoE model at tensor_model_parallel_size > 1 needs sequence parallelism, which the "
            "CPU (local spec) build cannot run; on CPU shard MoE models with expert_model_parallel_size "
            "(and data/pipeline parallel) and keep tensor_model_parallel_size: 1"
        )
    moe = _moe_settings(dims, cpu=cpu)
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.ffn_hidden_size,
        num_attention_heads=dims.num_attention_heads,
        num_query_groups=dims.num_query_groups,
        kv_channels=dims.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=dims.norm_epsilon,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        qk_layernorm=dims.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        expert_model_parallel_size=layout.expert_model_parallel_size,
        expert_tensor_parallel_size=layout.expert_tensor_parallel_size,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        # The GRPO loss is already divided by the global mini-batch count: no per-microbatch or
        # per-DP-rank rescaling by megatron (gradients are summed over DP).
        calculate_per_token_loss=True,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the HF folder
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        **moe,
    )


def build_gpt_model(dims: GPTDims, layout: MegatronLayout, *, param_dtype: str) -> Any:
    """This rank's stage of the GPTModel (no weights loaded yet)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(dims, layout, param_dtype=param_dtype)
    spec = get_gpt_layer_local_spec(
        num_experts=dims.num_experts, qk_layernorm=dims.qk_layernorm, normalization="RMSNorm"
    )
    with patches.cpu_runtime_mode():
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=dims.padded_vocab_size(
                layout.tensor_model_parallel_size, layout.make_vocab_size_divisible_by
            ),
            max_sequence_length=dims.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(),
            post_process=ps.is_pipeline_last_stage(),
            parallel_output=True,
            share_embeddings_and_output_weights=dims.tied_embeddings,
            position_embedding_type="rope",
            rotary_base=int(dims.rope_theta),
        )
    device = torch.device("cpu") if patches.on_cpu() else torch.device("cuda", torch.cuda.current_device())
    return model.to(device)


def load_hf_weights(model: torch.nn.Module, dims: GPTDims, coords: ShardCoords, source: TensorSource) -> None:
    """Copy this rank's shard of every megatron parameter from the HF weights."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, target in state.items():
            if not is_weight_name(name) or not isinstance(target, torch.Tensor):
                continue
            shard = megatron_shard(name, dims, coords, source)
            if tuple(shard.shape) != tuple(target.shape):
                raise ValueError(
                    f"{name}: HF weights give shape {tuple(shard.shape)}, the megatron model wants "
                    f"{tuple(target.shape)}; the checkpoint's config.json does not match its weights"
                )
            target.copy_(shard.to(target.dtype))


def freeze_pad_embedding(model: Any, pad_token_id: int) -> None:
    """Match HF's ``nn.Embedding(padding_idx=pad_token_id)``: lookups of the pad token give the
    usual vector but send no gradient into its row (megatron's embedding has no padding_idx).

    A forward hook keeps the forward bit-identical and only detaches the pad positions; a tied
    output layer still trains that row through the logits, exactly as in HF.
    """
    embedding: Any = model.embedding.word_embeddings

    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        is_pad = (inputs[0] == pad_token_id).unsqueeze(-1)
        return torch.where(is_pad, output.detach(), output)

    embedding.register_forward_hook(hook)


def load_model(
    model_path: str | os.PathLike[str], dims: GPTDims, layout: MegatronLayout, *, param_dtype: str
) -> Any:
    """Build this rank's stage and fill it from the HF folder (only this rank's slices are read)."""
    coords = rank_coords(layout)
    coords.check(dims)
    model = build_gpt_model(dims, layout, param_dtype=param_dtype)
    load_hf_weights(model, dims, coords, SafetensorsSource(model_path))
    if dims.pad_token_id is not None and coords.pp_rank == 0:
        freeze_pad_embedding(model, dims.pad_token_id)
    return model
