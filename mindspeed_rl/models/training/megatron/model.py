"""Build a megatron-core GPTModel from an HF config and load this rank's shard.

The layer spec follows the device (:func:`layer_spec_choice`): TransformerEngine's on CUDA when
it is importable, the local spec on NPU (patched by MindSpeed) and on CPU. The code runs on
megatron-core 0.12.1 (what MindSpeed supports) and 0.19.2; where they differ it asks the
installed one (signatures, attributes), not its version.

Requires ``torch.distributed`` to be initialised by the caller (the worker group, torchrun or a
test's spawn); :func:`init_model_parallel` then sets up megatron's TP/PP/EP/DP groups once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mindspeed_rl.models.training.megatron import (
    context_parallel,
    patches,
    routing_replay,
    stages,
    uneven_stages,
)
from mindspeed_rl.models.training.megatron.attention import attention_choice
from mindspeed_rl.models.training.megatron.hf_mapping import megatron_shard
from mindspeed_rl.models.training.megatron.hf_sources import SafetensorsSource, TensorSource
from mindspeed_rl.models.training.megatron.layout import (
    DeviceKind,
    MegatronLayout,
    SpecKind,
    check_trainable,
    spec_kind,
)
from mindspeed_rl.models.training.megatron.param_names import is_weight_name
from mindspeed_rl.weights.megatron_dims import GPTDims, ShardCoords

_log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def init_model_parallel(layout: MegatronLayout, seed: int) -> None:
    """Create megatron's process groups for ``layout`` (idempotent for the same layout)."""
    if not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialised; the megatron engine runs inside a worker group "
            "(mindspeed_rl.workers.training_group) or under torchrun, one process per rank"
        )
    patches.import_megatron(layout)
    patches.patch_current_device()
    patches.adapt_dist_checkpoint_writer()
    from megatron.core import parallel_state as ps

    layout.data_parallel_size(dist.get_world_size())
    if ps.model_parallel_is_initialized():
        current = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
        )
        wanted = (
            layout.tensor_model_parallel_size,
            layout.pipeline_model_parallel_size,
            layout.context_parallel_size,
        )
        if current != wanted:
            raise ValueError(f"megatron is already initialised with (tp, pp, cp)={current}, not {wanted}")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor_model_parallel_size,
            pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
            context_parallel_size=layout.context_parallel_size,
            expert_model_parallel_size=layout.expert_model_parallel_size,
            expert_tensor_parallel_size=layout.expert_tensor_parallel_size,
        )
    context_parallel.configure(layout, patches.device_kind())
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
        stage_layers=() if stages.is_even(layout.stage_layers) else layout.stage_layers,
    )


@dataclass(frozen=True, slots=True)
class LayerSpecChoice:
    """Which ``megatron.core.models.gpt.gpt_layer_specs`` builder makes the layer spec, and how."""

    builder: str
    kwargs: dict[str, Any]

    @property
    def kind(self) -> SpecKind:
        return "transformer_engine" if self.builder == _TE_SPEC else "local"


_LOCAL_SPEC = "get_gpt_layer_local_spec"
_TE_SPEC = "get_gpt_layer_with_transformer_engine_spec"


def layer_spec_choice(
    dims: GPTDims, device_kind: DeviceKind, *, transformer_engine: bool | None = None
) -> LayerSpecChoice:
    """The layer spec for ``device_kind`` (:func:`~.layout.spec_kind` says which and why).

    The keyword arguments are the ones both megatron-core 0.12.1 and 0.19.2 accept. MoE experts:
    TransformerEngine's grouped GEMM (TEGroupedMLP) on the TE spec; megatron's SequentialMLP on
    the local one (CPU has no grouped GEMM; on NPU MindSpeed's GroupedMLP would change the weight
    names, ``experts.weight1/2``, which hf_mapping does not map).
    """
    kind = spec_kind(device_kind, transformer_engine=transformer_engine)
    common: dict[str, Any] = {"num_experts": dims.num_experts, "qk_layernorm": dims.qk_layernorm}
    if kind == "transformer_engine":
        # TE's norms read config.normalization; the builder has no normalization argument in 0.12.1.
        return LayerSpecChoice(_TE_SPEC, {**common, "moe_grouped_gemm": dims.is_moe})
    return LayerSpecChoice(_LOCAL_SPEC, {**common, "moe_grouped_gemm": False, "normalization": "RMSNorm"})


def build_layer_spec(choice: LayerSpecChoice, *, context_parallel_size: int = 1) -> Any:
    from megatron.core.models.gpt import gpt_layer_specs

    spec = getattr(gpt_layer_specs, choice.builder)(**choice.kwargs)
    stand_in = context_parallel.attention_stand_in()
    if context_parallel_size > 1 and stand_in is not None and choice.kind == "local":
        # The CPU test's CP attention (context_parallel.set_attention_stand_in) in place of
        # megatron's local DotProductAttention, which refuses CP (0.12.1 and 0.19.2).
        attention = spec.submodules.self_attention
        attention.submodules = dataclasses.replace(attention.submodules, core_attention=stand_in)
    return spec


def uses_variable_seq_lengths(layout: MegatronLayout, *, moe_allgather: bool) -> bool:
    """Whether the pipeline exchanges each micro-batch's shape (PP > 1), so that micro-batches can
    keep their own widths; megatron's allgather MoE dispatcher refuses it (0.12.1 and 0.19.2)."""
    return layout.pipeline_model_parallel_size > 1 and not moe_allgather


def _moe_settings(dims: GPTDims, *, cpu: bool, grouped_gemm: bool) -> dict[str, Any]:
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
        "moe_grouped_gemm": grouped_gemm,
    }


def _kernel_settings(layout: MegatronLayout, device_kind: DeviceKind, spec: SpecKind) -> dict[str, Any]:
    """Fusions: all off on CPU (and with the local spec on CUDA); the layout's switches elsewhere.

    The attention mask is always the explicit causal one (:func:`patches.causal_attention_mask`),
    so the masked-softmax fusion stays off everywhere.
    """
    off = {
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
    }
    # Asked of megatron on every device: the GPTModel turns it into TransformerEngine's NVTE_*
    # switches, so `local` where the local spec runs keeps them off (attention.py says why).
    off["attention_backend"] = _attention_backend(layout, device_kind, spec)
    if device_kind == "cpu" or (device_kind == "cuda" and spec == "local"):
        return off
    # SwiGLU: megatron calls its bias_swiglu kernel only under bias_activation_fusion; MindSpeed
    # (26.1.0_core_r0.12.1, features_manager/fusions/fused_bias_swiglu.py) replaces that kernel by
    # torch_npu's npu_swiglu. RoPE on NPU: MindSpeed's patched apply_rotary_pos_emb reads its own
    # use_fused_rotary_pos_emb flag (from the argv of import_megatron) and apply_rope_fusion must
    # stay off there (it would route to apex's CUDA kernel).
    settings = {**off, "bias_activation_fusion": layout.use_fused_swiglu}
    if device_kind == "cuda":
        settings["apply_rope_fusion"] = layout.use_fused_rotary_pos_emb
    return settings


def _attention_backend(layout: MegatronLayout, device_kind: DeviceKind, spec: SpecKind) -> Any:
    """megatron's AttnBackend member for this build (:func:`attention.attention_choice`), with a
    log line naming the kernel, a warning when ``use_flash_attn`` is served by another one."""
    from megatron.core.transformer.enums import AttnBackend

    choice = attention_choice(device_kind, spec, use_flash_attn=layout.use_flash_attn)
    log = _log.warning if choice.substituted else _log.info
    log("attention: AttnBackend.%s, %s", choice.backend, choice.kernel)
    return getattr(AttnBackend, choice.backend)


def _cp_settings(config_class: Any, layout: MegatronLayout, spec: SpecKind) -> dict[str, Any]:
    """TE's CP communication for the layout's algorithm (``cp_support.SUPPORTED_ALGOS``): the
    ``cp_comm_type`` field of megatron-core 0.19.2's TransformerConfig. megatron-core 0.12.1
    (MindSpeed's) reads ``--context-parallel-algo`` from MindSpeed's own arguments instead."""
    if layout.context_parallel_size == 1 or spec != "transformer_engine":
        return {}
    from mindspeed_rl.models.training.megatron.cp_support import SUPPORTED_ALGOS

    if "cp_comm_type" not in {f.name for f in dataclasses.fields(config_class)}:
        raise ValueError(
            "this megatron-core's TransformerConfig has no cp_comm_type, so the context_parallel_algo "
            f"{layout.context_parallel_algo} cannot be passed to TransformerEngine; install "
            "megatron-core 0.19.2 (the gpu-trainer stack)"
        )
    return {"cp_comm_type": SUPPORTED_ALGOS[layout.context_parallel_algo]}


def transformer_config(
    dims: GPTDims, layout: MegatronLayout, *, param_dtype: str, device_kind: DeviceKind | None = None
) -> Any:
    """Megatron's TransformerConfig for ``dims``: every fusion off on CPU, dropout off (RL).

    Field names and validity rules checked against megatron-core 0.12.1 and 0.19.2
    (transformer_config.py, model_parallel_config.py); :func:`check_trainable` refuses what they
    (or the layer spec) would refuse, with the config keys to change.
    """
    kind = patches.device_kind() if device_kind is None else device_kind
    # Before importing megatron: a refusal costs nothing.
    check_trainable(dims, layout, kind, cp_stand_in=context_parallel.attention_stand_in() is not None)
    from megatron.core.transformer import TransformerConfig

    spec = layer_spec_choice(dims, kind)
    dtype = _DTYPES[param_dtype]
    cpu = kind == "cpu"
    moe = _moe_settings(dims, cpu=cpu, grouped_gemm=spec.kwargs["moe_grouped_gemm"])
    variable = uses_variable_seq_lengths(
        layout, moe_allgather=moe.get("moe_token_dispatcher_type") == "allgather"
    )
    if variable and not dims.is_moe:
        # TransformerConfig refuses variable_seq_lengths with its default dispatcher, allgather,
        # even without experts (0.12.1 and 0.19.2); a dense model builds no dispatcher at all.
        moe["moe_token_dispatcher_type"] = "alltoall"
    recompute: dict[str, Any] = {}
    if layout.recompute_granularity is not None:
        recompute = {
            "recompute_granularity": layout.recompute_granularity,
            "recompute_method": layout.recompute_method,
            "recompute_num_layers": layout.recompute_num_layers,
        }
    stage_list = () if stages.is_even(layout.stage_layers) else layout.stage_layers
    config = TransformerConfig(
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
        sequence_parallel=layout.sequence_parallel,
        context_parallel_size=layout.context_parallel_size,
        variable_seq_lengths=variable,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        # The GRPO loss is already divided by the global mini-batch count: no per-microbatch or
        # per-DP-rank rescaling by megatron (gradients are summed over DP).
        calculate_per_token_loss=True,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the HF folder
        **_kernel_settings(layout, kind, spec.kind),
        **recompute,
        **moe,
        **uneven_stages.config_kwargs(TransformerConfig, stage_list),
        **_cp_settings(TransformerConfig, layout, spec.kind),
        **routing_replay.replay_config_kwargs(TransformerConfig, is_moe=dims.is_moe),
    )
    uneven_stages.attach(config, stage_list)  # megatron-core without layouts (0.12.1)
    return config


def mark_tensor_parallel_weights(model: torch.nn.Module) -> int:
    """Give every TP-split weight megatron's ``tensor_model_parallel`` / ``partition_dim`` /
    ``partition_stride`` attributes where the build left them out; returns how many it set.

    megatron-core 0.12.1 (tensor_parallel/layers.py, transformer/moe/experts.py) sets them only
    inside its weight initialisers, which ``perform_initialization=False`` skips, so gradient-norm
    code that counts each shard once (``param_is_not_tensor_parallel_duplicate``, the engine's
    ``global_grad_norm``) counted split weights on TP rank 0 only; 0.19.2 sets them either way
    (then this finds nothing to do). Stride 1 is what 0.12.1 itself sets when it initialises.
    """
    from megatron.core import tensor_parallel
    from megatron.core.transformer.moe import experts

    split_dims: dict[type, dict[str, int]] = {
        tensor_parallel.VocabParallelEmbedding: {"weight": 0},
        tensor_parallel.ColumnParallelLinear: {"weight": 0},
        tensor_parallel.RowParallelLinear: {"weight": 1},
    }
    # The legacy GroupedMLP (weight1 [hidden, fc1/tp], weight2 [fc2/tp, hidden]) is gone in 0.19.2.
    grouped = getattr(experts, "GroupedMLP", None)
    if grouped is not None:
        split_dims[grouped] = {"weight1": 1, "weight2": 0}
    marked = 0
    for module in model.modules():
        for cls, weights in split_dims.items():
            if not isinstance(module, cls):
                continue
            for attr, dim in weights.items():
                weight = getattr(module, attr, None)
                if isinstance(weight, torch.nn.Parameter) and not hasattr(weight, "tensor_model_parallel"):
                    tensor_parallel.set_tensor_model_parallel_attributes(weight, True, dim, 1)
                    marked += 1
    return marked


def build_gpt_model(dims: GPTDims, layout: MegatronLayout, *, param_dtype: str) -> Any:
    """This rank's stage of the GPTModel (no weights loaded yet)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    kind = patches.device_kind()
    config = transformer_config(dims, layout, param_dtype=param_dtype, device_kind=kind)
    spec = build_layer_spec(layer_spec_choice(dims, kind), context_parallel_size=layout.context_parallel_size)
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
    mark_tensor_parallel_weights(model)
    device = torch.device("cpu") if kind == "cpu" else torch.device("cuda", torch.cuda.current_device())
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
