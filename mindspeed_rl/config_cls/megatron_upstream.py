"""The rest of upstream's flat Megatron keys: features this framework does not have, and switches
with no effect here.

Upstream accepts every key below (``MegatronConfig``), so its YAML carries them. Each is typed with
upstream's default and classified on its field (``fields.opt``):

* ``refused``: a value other than the default (and the ``accepts`` values) asks for a feature
  the engines do not build (LoRA, multi-latent attention, DPO, ...): the loader stops, naming the
  key and the feature, instead of training something else than the YAML describes;
* ``inert``: the key tunes a kernel, a memory trick or a data path this framework does not have;
  the loader lists it with the reason when it is given.

These are groups of ``megatron_config.MegatronConfig`` like the others; the model-architecture
group (``model_arch``) holds only keys the model builder maps, so these stay out of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mindspeed_rl.config_cls.fields import PARALLEL_ONLY, TORCH_ONE_REPLICA, megatron_reason, opt

_MLA = (
    "multi-latent attention (DeepSeek) is not supported: both engines build Qwen2.5/Qwen3(-MoE) "
    "grouped-query attention; train a Qwen model"
)
_YARN = (
    "yarn / frequency-scaled RoPE (DeepSeek-V3, Llama 3.x) is not supported: both engines build "
    "plain RoPE from rotary_base"
)
_DEEPSEEK_ROUTER = (
    "DeepSeek-style MoE routing (sigmoid scores, expert-bias balancing, group-limited top-k, routed "
    "scaling, sequence-level aux loss) is not supported: the engines build Qwen3-MoE's softmax top-k "
    "router (num_experts, moe_router_topk, norm_topk_prob, moe_aux_loss_coeff)"
)
_LORA = "LoRA is not supported: the policy trains all of its weights"
_DPO = (
    "DPO is not supported: this framework trains GRPO on prompts with rule rewards "
    "(stage: ray_grpo, rl_config.verifier_function)"
)
_MULTIMODAL = "multimodal models are not supported: the policy is a text-only Qwen model"
_CP_TUNING = megatron_reason(
    "ring-attention tuning the megatron engine does not pass to MindSpeed (same results)",
    torch=TORCH_ONE_REPLICA,
)
_PADDING = "the engines pad each micro-batch to its own longest sequence and never pack sequences together"
_ROLLOUT = "rollouts run on the rollout engine (vLLM / HF generate, generate_config), not the trainer"
_NO_COC = megatron_reason(
    "the megatron engine does not enable Ascend compute-communication overlap (same results)"
)

# Upstream's Qwen3 layer spec (MindSpeed-LLM), as its model files write it: the layers the engines
# already build from qk_layernorm and the other architecture keys.
QWEN3_SPEC = ("mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec")


def _is_qwen3_spec(value: Any, _siblings: Any) -> bool:
    parts = tuple(value.split()) if isinstance(value, str) else value
    return parts == QWEN3_SPEC


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsupportedArchitectureKeys:
    """Architecture and layout keys whose non-default values describe a network the engines do not
    build (they build Qwen2.5, Qwen3 and Qwen3-MoE layers, split over pipeline stages)."""

    attention_bias: bool = opt(
        False,
        "Bias on the attention projections (HF Qwen3's attention_bias: Q, K, V and output).",
        refused=(
            "attention_bias: true (bias on the Q/K/V and output projections) is not supported: Qwen3 "
            "has no attention bias, and Qwen2.5's Q/K/V-only bias is add_qkv_bias: true"
        ),
    )
    spec: str | tuple[str, ...] | None = opt(
        None,
        "MindSpeed-LLM layer spec [module, function].",
        refused=(
            "custom layer specs are not supported: the engines build Qwen2.5/Qwen3(-MoE) layers from the "
            "architecture keys; the one spec accepted is upstream's Qwen3 spec "
            f"[{', '.join(QWEN3_SPEC)}], which names those same layers"
        ),
        accepts=_is_qwen3_spec,
        inert="names upstream's Qwen3 layer spec: the layers the engines build from the architecture keys",
    )
    multi_latent_attention: bool = opt(False, "Multi-latent attention (DeepSeek).", refused=_MLA)
    q_lora_rank: int | None = opt(None, "MLA: low rank of Q.", refused=_MLA)
    kv_lora_rank: int | None = opt(None, "MLA: low rank of K and V.", refused=_MLA)
    qk_head_dim: int | None = opt(None, "MLA: Q/K head dim without RoPE.", refused=_MLA)
    qk_pos_emb_head_dim: int | None = opt(None, "MLA: Q/K head dim with RoPE.", refused=_MLA)
    v_head_dim: int | None = opt(None, "MLA: V head dim.", refused=_MLA)
    rope_scaling_type: str | None = opt(None, "RoPE scaling kind (yarn, llama3).", refused=_YARN)
    rope_scaling_factor: float = opt(1.0, "RoPE scaling factor.", refused=_YARN)
    rope_scaling_mscale: float = opt(1.0, "Yarn mscale.", refused=_YARN)
    rope_scaling_mscale_all_dim: float = opt(0.0, "Yarn mscale over all dims.", refused=_YARN)
    rope_scaling_original_max_position_embeddings: int | None = opt(
        None, "Yarn: context length before scaling.", refused=_YARN
    )
    beta_fast: float = opt(32, "Yarn beta fast.", refused=_YARN)
    beta_slow: float = opt(1, "Yarn beta slow.", refused=_YARN)
    low_freq_factor: float | None = opt(None, "Llama 3 RoPE low-frequency factor.", refused=_YARN)
    high_freq_factor: float | None = opt(None, "Llama 3 RoPE high-frequency factor.", refused=_YARN)
    original_max_position_embeddings: int | None = opt(
        None, "Llama 3 RoPE: context length before scaling.", refused=_YARN
    )
    moe_router_score_function: str = opt(
        "softmax", "MoE router scores (softmax or sigmoid).", refused=_DEEPSEEK_ROUTER
    )
    moe_router_enable_expert_bias: bool = opt(
        False, "Aux-loss-free balancing with a per-expert bias.", refused=_DEEPSEEK_ROUTER
    )
    moe_router_num_groups: int | None = opt(
        None, "Expert groups for group-limited routing.", refused=_DEEPSEEK_ROUTER
    )
    moe_router_group_topk: int | None = opt(None, "Groups chosen per token.", refused=_DEEPSEEK_ROUTER)
    moe_router_topk_scaling_factor: float | None = opt(
        None, "Routed-weight scaling.", refused=_DEEPSEEK_ROUTER
    )
    seq_aux: bool = opt(False, "Sequence-level auxiliary balancing loss.", refused=_DEEPSEEK_ROUTER)
    attention_mask_type: str = opt(
        "causal",
        "Attention mask kind.",
        refused="attention masks other than causal are not supported: the policy is a causal LM",
    )
    vocab_extra_ids: int = opt(
        0,
        "Extra sentinel tokens (T5).",
        refused="extra vocabulary ids are not supported: the vocabulary is the HF tokenizer's",
    )
    mm_model: Any = opt(None, "Multimodal model settings.", refused=_MULTIMODAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsupportedTrainingKeys:
    """Training modes and sources this framework does not have."""

    lora_r: int = opt(8, "LoRA rank.", refused=_LORA)
    lora_alpha: int = opt(16, "LoRA alpha.", refused=_LORA)
    lora_fusion: bool = opt(False, "Fused LoRA kernels.", refused=_LORA)
    lora_ckpt_filter: bool = opt(False, "Save only the LoRA weights.", refused=_LORA)
    lora_target_modules: tuple[str, ...] | None = opt(None, "Modules given LoRA adapters.", refused=_LORA)
    dpo_loss_type: str = opt("sigmoid", "DPO loss variant.", refused=_DPO)
    is_pairwise_dataset: bool = opt(False, "Chosen/rejected pairs (DPO, reward models).", refused=_DPO)
    ref_model: str = opt("", "DPO's reference checkpoint.", refused=_DPO)
    refer_model_iter: int = opt(1, "DPO's reference refresh interval.", refused=_DPO)
    skip_train: bool = opt(
        False,
        "Evaluate only, no training.",
        refused=(
            "skip_train (evaluation without training) is not supported: a run trains; "
            "eval_interval adds periodic evaluation"
        ),
    )
    pretrained_checkpoint: str | None = opt(
        None,
        "Megatron checkpoint to fine-tune from.",
        refused=(
            "pretrained_checkpoint is not supported: the initial weights are the HF folder "
            "tokenizer_name_or_path, or actor_config.load with finetune: true"
        ),
    )
    ai_framework: str | None = opt(
        None,
        "Training framework (null = PyTorch, mindspore).",
        refused="the MindSpore backend is not supported: this framework trains with PyTorch",
    )
    algorithm: str | None = opt(
        None,
        "Upstream Megatron algorithm tag.",
        refused="megatron_training.algorithm has no counterpart here: the algorithm is GRPO (stage, rl_config)",
    )
    enable_high_availability: bool = opt(
        False,
        "MindIO high availability (Ascend).",
        refused=(
            "MindIO high availability is not supported: restart a failed run from its checkpoints "
            "(save_interval, then load without finetune)"
        ),
    )
    prompt_type_path: str | None = opt(
        None,
        "JSON file of chat templates (upstream default: its configs/model/templates.json).",
        refused=(
            "custom chat-template files are not supported: prompt_type picks a built-in template "
            "(empty, qwen_r1, qwen3)"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamInertKeys:
    """Upstream kernel, memory, communication and data-loader switches with no effect here."""

    shape_order: str = opt(
        "SBH",
        "Tensor layout of MindSpeed's fused attention.",
        inert=megatron_reason("the megatron engine keeps megatron-core's attention layout"),
    )
    swap_optimizer: bool = opt(
        False,
        "Swap optimizer state to host memory (MindSpeed).",
        inert=megatron_reason(
            "honoured on NPU, where it passes --swap-optimizer to MindSpeed (with use_distributed_optimizer: "
            "true; plan.sections.swaps_optimizer); megatron-core 0.19.2 (CUDA) and the CPU path have no swap "
            "optimizer: the state stays on the device, where the memory planner counts it (same results)",
            torch="the torch engine keeps its optimizer state on the device (same results)",
        ),
    )
    use_ascend_coc: bool = opt(False, "Ascend compute-communication overlap.", inert=_NO_COC)
    coc_mode: int = opt(-1, "CoC mode.", inert=_NO_COC)
    coc_parallel_num: int = opt(1, "CoC parallel chunks.", inert=_NO_COC)
    coc_fused_kernel: bool = opt(False, "CoC fused kernel.", inert=_NO_COC)
    recompute_activation_function: bool = opt(
        False,
        "Recompute the MLP activation.",
        inert="MindSpeed activation recomputation; results are the same",
    )
    context_parallel_algo: str = opt(
        "ulysses_cp_algo",
        "Context-parallel attention at context_parallel_size > 1: megatron_cp_algo (ring attention over "
        "megatron's load-balanced split; TransformerEngine p2p on CUDA) or ulysses_cp_algo (all-to-all "
        "over heads; TE a2a). hybrid_cp_algo, adaptive_cp_algo and hybrid_adaptive_cp_algo are refused.",
        inert_on_torch=PARALLEL_ONLY,
    )
    use_cp_send_recv_overlap: bool = opt(False, "Overlap context-parallel send/recv.", inert=_CP_TUNING)
    use_fused_ring_attention_update: bool = opt(False, "Fused ring-attention update.", inert=_CP_TUNING)
    ddp_bucket_size: int | None = opt(
        None,
        "Gradient bucket size of data-parallel reduction.",
        inert=megatron_reason(
            "communication tuning; the megatron engine keeps megatron-core's bucketing",
            torch=TORCH_ONE_REPLICA,
        ),
    )
    no_check_for_nan_in_loss_and_grad: bool = opt(
        False,
        "Skip megatron's NaN check.",
        inert="both engines always stop on a non-finite gradient norm, naming the learning rate",
    )
    use_tp_pp_dp_mapping: bool = opt(
        False,
        "Rank order tp-pp-dp instead of tp-dp-pp.",
        inert=megatron_reason(
            "rank ordering; the megatron engine keeps megatron-core's default order",
            torch=TORCH_ONE_REPLICA,
        ),
    )
    npu_deterministic: bool = opt(
        False,
        "Deterministic NPU kernels.",
        inert=megatron_reason("the megatron engine does not pass MindSpeed's deterministic-kernel switch"),
    )
    transformer_impl: str = opt(
        "local",
        "Megatron layer implementation.",
        inert=megatron_reason(
            "the megatron engine picks the implementation per device: TransformerEngine on CUDA when "
            "installed, local on NPU and CPU"
        ),
    )
    dataloader_type: str | None = opt(
        None, "Megatron data loader kind.", inert="prompts are drawn by this framework's own loader"
    )
    num_workers: int = opt(
        2, "Data loader worker processes.", inert="prompts are loaded in the driver process"
    )
    pad_to_multiple_of: int = opt(8, "Pad sequences to a multiple of this.", inert=_PADDING)
    no_pad_to_seq_lengths: bool = opt(False, "Do not pad to seq_length.", inert=_PADDING)
    reset_attention_mask: bool = opt(False, "Restart the mask at each packed document.", inert=_PADDING)
    reset_position_ids: bool = opt(False, "Restart positions at each packed document.", inert=_PADDING)
    tokenizer_padding_side: str = opt(
        "right", "Tokenizer padding side.", inert="batches are padded by the engines, not the tokenizer"
    )
    tokenizer_not_use_fast: bool = opt(
        False, "Load the slow HF tokenizer.", inert="the HF tokenizer is loaded as AutoTokenizer chooses"
    )
    use_kv_cache: bool = opt(False, "KV cache for Megatron generation.", inert=_ROLLOUT)
    do_sample: bool = opt(False, "Sample in Megatron generation.", inert=_ROLLOUT)
    log_throughput: bool = opt(
        False,
        "Log throughput per device.",
        inert="logging only: tokens_per_s and iteration_time_s are in every iteration's metrics",
    )
