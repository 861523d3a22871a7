"""Device memory per trainer rank and per rollout actor, by term, before anything is loaded.

``check_config --cluster NxD`` prints these next to the placement, and a plan that does not fit
its device stops there (exit 2) naming the rank, the largest term and a key that shrinks it:
a 30 B run should fail on a laptop in a second, not after an hour of weight loading.

Deterministic terms (exact, in bytes, for the megatron engine as built by
``models/training/megatron``): parameters, gradient buffer, optimizer state, reference model.
Their per-rank parameter counts follow megatron-core's GPTModel sharding (vocabulary padded to a
multiple of ``make_vocab_size_divisible_by x TP`` and split over TP; QKV, output projection and
dense MLP split over TP; routed experts split over EP, whole on each rank; norms, q/k norms and the
router replicated; layers split over PP as the stages list them (evenly by default); embedding on the first stage, output layer and
final norm on the last, and a tied output layer still holds a copy of the embedding on the last
stage when PP > 1). A test checks them against the tensors of real megatron models on CPU.

Estimated terms: activations and headroom for the trainer, activations and the KV cache for
vLLM. The activation model is that of Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022, arXiv:2205.05198, section 4), re-derived for this model family:
16-bit activations, no dropout (RL trains without it), grouped-query attention, SwiGLU MLPs and
top-k routed experts. Per layer, per micro-batch of ``b`` sequences of ``s`` tokens (bytes):

    norm inputs 4sbh + QKV input 2sbh + Q,K,V 2sb(a+2g)d + attention output 2sbad
    + [no flash attention: fp32 softmax output and 16-bit probabilities 6as^2b] + MLP: fc1 input 2sbh + 6sbf
    (fc1 output 2 x 2sbf, activation 2sbf; f = ffn width) or, routed, topk x (2sbh + 6sbf_moe)

Tensor parallelism divides every term except the four ``sbh`` norm and block inputs, which
sequence parallelism divides too (the paper's 10sbh, minus its two dropout masks). Full
recomputation keeps only each layer's input (2sbh, /TP under SP) plus one layer's full set while
it recomputes (once: only the micro-batch being back-propagated rebuilds it; ``block`` keeps
the full set of the layers past ``recompute_num_layers``). The last stage adds the micro-batch's vocab-parallel logits (2 s b V / TP) and the
fp32 log-softmax chunk of ``LOGPROB_CHUNK`` tokens. With 1F1B the first stage holds up to PP
micro-batches in flight. Context parallelism divides ``s`` by CP in every term of a rank.

MindSpeed's swap optimizer (``swap_optimizer`` on NPU) keeps the optimizer state on the host
between steps: the optimizer term is then the one chunk a step holds on the device
(:func:`swap_chunk`), and a colocated rank keeps none of it when its rollout engine starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Device memory (GB) per accelerator when ``--device-memory-gb`` is not given: the smallest common
# part of each kind (Ascend 910B/910C: 64 GB per die; H100: 80 GB).
DEFAULT_DEVICE_MEMORY_GB = {"NPU": 64.0, "GPU": 80.0}
# Runtime context, communicator buffers and allocator slack of a training process: a fixed
# estimate, not a measurement.
TRAINER_HEADROOM_GB = 3.0
# Tokens of the fp32 log-softmax temporaries (``models/training/log_probs.py`` chunks of 1024);
# three fp32 temporaries of the chunk's vocab-parallel logits are alive at once.
LOGPROB_CHUNK = 1024
LOGPROB_TEMPORARIES = 3
# MindSpeed's ``--swap-optimizer-times`` default (26.1.0_core_r0.12.1, SwapOptimizerFeature): the
# swap optimizer brings a rank's optimizer shard to the device in chunks of 1/16 of its elements.
SWAP_OPTIMIZER_TIMES = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The transformer shape the planner needs (from the YAML's ``model:`` file or an HF config)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    num_experts: int = 0
    """0 = dense."""
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def padded_vocab(self, tp: int, divisible_by: int) -> int:
        step = divisible_by * tp
        return -(-self.vocab_size // step) * step


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCount:
    """Parameters one rank holds: ``dense`` ones are replicated over DP, ``expert`` ones over the
    expert-data-parallel group (world / (EP x PP)); the distributed optimizer shards each over its
    own group."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerMemorySpec:
    """What the trainer's memory depends on (``plan`` fills it from the config)."""

    shape: ModelShape
    tp: int
    pp: int
    ep: int
    world_size: int
    make_vocab_size_divisible_by: int
    param_dtype: Literal["float32", "bfloat16", "float16"]
    grads_in_fp32: bool
    """Megatron DDP's gradient buffer dtype: fp32, or the parameters' dtype."""
    distributed_optimizer: bool
    reference: bool
    """A reference model (KL anywhere), in the parameters' dtype."""
    reference_offloaded: bool = False
    """The reference's weights are on the host except during its own log-prob pass
    (``rl_config.use_integrated_worker``, ``models/training/host_residency.py``): the training
    peak and the colocated start-up do not hold them; :func:`reference_pass_memory` does."""
    reference_micro_batch_size: int | None = None
    """Micro-batch of the reference's forward pass (``ref_forward_micro_batch_size``); None =
    ``micro_batch_size``."""
    micro_batch_size: int
    seq_length: int
    sequence_parallel: bool
    flash_attention: bool
    recompute_granularity: Literal["full", "selective"] | None
    recompute_num_layers: int | None = None
    """Full recomputation: layers per recomputed chunk (``uniform``), or recomputed layers of a
    stage (``block``: the rest keep their activations)."""
    recompute_method: Literal["uniform", "block"] | None = None
    stage_layers: tuple[int, ...] = ()
    """Real layers per pipeline stage (uneven stages, noop layers left out); () = num_layers / PP."""
    routing_replay: bool = False
    """MoE routing replay: the micro-batch's routing to replay sits on the device beside it."""
    cp: int = 1
    """Context-parallel ranks: each holds ``seq_length / cp`` tokens of every sequence."""
    swap_optimizer_times: int = 0
    """MindSpeed's swap optimizer (NPU): its state lives on the host between steps and comes to the
    device in chunks of 1/``swap_optimizer_times`` of the shard during a step (:func:`swap_chunk`);
    0 = the state stays on the device."""

    def layers_on_stage(self, pp_rank: int) -> int:
        return self.stage_layers[pp_rank] if self.stage_layers else self.shape.num_layers // self.pp

    @property
    def dp(self) -> int:
        """Ranks the distributed optimizer shards over: megatron's data-parallel group *with*
        context parallelism (DP x CP), the group DDP reduces gradients over."""
        return self.world_size // (self.tp * self.pp)

    @property
    def expert_dp(self) -> int:
        return self.world_size // (self.ep * self.pp)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutMemorySpec:
    shape: ModelShape
    tp: int
    expert_parallel: int = 0
    """Workers the routed experts are spread over, each expert whole (vLLM's expert parallelism:
    TP x the engines' data parallelism); 0 = split over TP like the dense weights."""
    dtype: Literal["float32", "bfloat16", "float16"]
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    routing_capture: bool = False
    """Routing replay R3: vLLM's routed-experts capture buffer (vllm 0.32 ``RoutedExpertsCapturer``:
    int32, one row per token of the step's budget, every MoE layer, top-k)."""


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per term; ``total`` is their sum, ``budget`` what the device (or vLLM's share) has."""

    terms: Mapping[str, float]
    budget: float

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def fits(self) -> bool:
        return self.total <= self.budget

    def largest(self) -> str:
        return max(self.terms, key=lambda k: self.terms[k])

    def as_gb(self) -> dict[str, float]:
        out = {"total": round(self.total / GB, 2)}
        out.update({k: round(v / GB, 2) for k, v in self.terms.items()})
        return out


def rank_parameters(
    shape: ModelShape,
    *,
    tp: int,
    pp: int,
    ep: int,
    pp_rank: int,
    divisible_by: int,
    stage_layers: tuple[int, ...] = (),
) -> ParamCount:
    """Parameters of one rank at pipeline stage ``pp_rank`` (every TP/EP rank holds the same count);
    ``stage_layers``: real layers per stage when they are uneven."""
    if not stage_layers and shape.num_layers % pp:
        raise ValueError(
            f"num_layers={shape.num_layers} is not divisible by pipeline_model_parallel_size={pp}"
        )
    if shape.is_moe and shape.num_experts % ep:
        raise ValueError(
            f"num_experts={shape.num_experts} is not divisible by expert_model_parallel_size={ep}"
        )
    h, d = shape.hidden_size, shape.head_dim
    a, g = shape.num_attention_heads, shape.num_query_groups
    qkv_out = (a + 2 * g) * d
    attention = h * qkv_out // tp + a * d * h // tp + (qkv_out // tp if shape.qkv_bias else 0)
    norms = 2 * h + (2 * d if shape.qk_layernorm else 0)
    if shape.is_moe:
        dense_mlp = shape.num_experts * h  # the router (replicated)
        expert = shape.num_experts // ep * 3 * h * shape.moe_ffn_hidden_size
    else:
        dense_mlp = 3 * h * shape.ffn_hidden_size // tp
        expert = 0
    layers = stage_layers[pp_rank] if stage_layers else shape.num_layers // pp
    dense = layers * (attention + norms + dense_mlp)
    vocab_rows = shape.padded_vocab(tp, divisible_by) // tp
    first, last = pp_rank == 0, pp_rank == pp - 1
    if first:
        dense += vocab_rows * h
    if last:
        dense += h  # final norm
        if not shape.tied_embeddings or not first:
            dense += vocab_rows * h  # output layer (a tied one is the embedding on a single stage)
    return ParamCount(dense=dense, expert=layers * expert)


def largest_parameter(
    shape: ModelShape,
    *,
    tp: int,
    pp: int,
    ep: int,
    pp_rank: int,
    divisible_by: int,
    stage_layers: tuple[int, ...] = (),
) -> int:
    """Elements of the largest single parameter tensor of a rank at stage ``pp_rank`` (megatron's
    fused QKV and gate+up ``linear_fc1``; a stage's local experts counted as one grouped tensor,
    ``GroupedMLP``'s ``weight1``, which bounds ``TEGroupedMLP``/``SequentialMLP``'s per-expert
    tensors from above). Under the distributed optimizer a parameter's shard is no larger."""
    h, d = shape.hidden_size, shape.head_dim
    qkv = h * (shape.num_attention_heads + 2 * shape.num_query_groups) * d // tp
    sizes = [qkv, shape.num_attention_heads * d * h // tp]
    if shape.is_moe:
        sizes += [shape.num_experts * h, shape.num_experts // ep * 2 * shape.moe_ffn_hidden_size * h]
    else:
        sizes.append(2 * shape.ffn_hidden_size * h // tp)
    layers = stage_layers[pp_rank] if stage_layers else shape.num_layers // pp
    if not layers:
        sizes = []
    if pp_rank == 0 or pp_rank == pp - 1:
        sizes.append(shape.padded_vocab(tp, divisible_by) // tp * h)
    return max(sizes, default=0)


def swap_chunk(shard: int, largest: int, times: int) -> int:
    """Elements of optimizer state the swap optimizer holds on the device at once during a step.

    MindSpeed 26.1.0_core_r0.12.1 (core/optimizer/swap_optimizer/swap_optimizer.py):
    ``swap_numel = swap_num // swap_optimizer_times`` over the rank's fp32 master shards;
    ``swap_adamw_step`` brings parameters in (master, ``exp_avg``, ``exp_avg_sq``) while the running
    count stays within ``swap_numel`` or holds nothing yet, steps each, sends it back, and brings
    the next chunk in only after the previous one has left (it waits on the swap-to-host stream). A
    chunk is therefore at most ``swap_numel`` elements, or one parameter larger than that."""
    return max(shard // times, min(largest, shard))


def trainer_memory(spec: TrainerMemorySpec, device_memory_gb: float, *, pp_rank: int = 0) -> MemoryEstimate:
    """One rank's memory at stage ``pp_rank``."""
    params = rank_parameters(
        spec.shape, tp=spec.tp, pp=spec.pp, ep=spec.ep, pp_rank=pp_rank,
        divisible_by=spec.make_vocab_size_divisible_by, stage_layers=spec.stage_layers,
    )  # fmt: skip
    pbytes = DTYPE_BYTES[spec.param_dtype]
    grad_bytes = 4 if spec.grads_in_fp32 else pbytes
    # Adam's two moments in fp32, plus fp32 master weights when the parameters are not fp32.
    state_bytes = 8 + (0 if spec.param_dtype == "float32" else 4)
    if spec.distributed_optimizer:
        shard = params.dense / spec.dp + params.expert / spec.expert_dp
    else:
        shard = float(params.total)
    if spec.swap_optimizer_times:
        # Only the chunk being stepped is on the device (the rest of the step's state is on host).
        biggest = largest_parameter(
            spec.shape, tp=spec.tp, pp=spec.pp, ep=spec.ep, pp_rank=pp_rank,
            divisible_by=spec.make_vocab_size_divisible_by, stage_layers=spec.stage_layers,
        )  # fmt: skip
        shard = swap_chunk(int(shard), biggest, spec.swap_optimizer_times)
    optimizer = float(state_bytes * shard)
    terms = {
        "parameters": float(pbytes * params.total),
        "gradients": float(grad_bytes * params.total),
        "optimizer_state": optimizer,
        "reference": float(pbytes * params.total) if spec.reference and not spec.reference_offloaded else 0.0,
        "activations": activation_bytes(spec, pp_rank=pp_rank),
        "headroom": TRAINER_HEADROOM_GB * GB,
    }
    if spec.routing_replay and spec.shape.is_moe:
        tokens = spec.micro_batch_size * spec.seq_length
        terms["routing_replay"] = float(
            routing_buffer_bytes_per_token(spec.shape, layers=spec.layers_on_stage(pp_rank), dtype_bytes=8)
            * tokens
        )
    return MemoryEstimate(terms=terms, budget=device_memory_gb * GB)


def reference_pass_memory(
    spec: TrainerMemorySpec, device_memory_gb: float, *, pp_rank: int = 0
) -> MemoryEstimate:
    """One rank's memory while the reference scores a batch: the policy's training state (loaded
    for the step that follows), the reference's weights and a forward pass's activations (no
    backward: nothing is kept past a layer, :func:`forward_activation_bytes`). Only a separate
    phase when the reference is offloaded; otherwise :func:`trainer_memory` already holds it."""
    held = trainer_memory(
        dataclasses.replace(spec, reference_offloaded=False, routing_replay=False),
        device_memory_gb,
        pp_rank=pp_rank,
    )
    terms = dict(held.terms)
    terms["activations"] = forward_activation_bytes(spec, pp_rank=pp_rank)
    return MemoryEstimate(terms=terms, budget=held.budget)


def routing_buffer_bytes_per_token(shape: ModelShape, *, layers: int | None = None, dtype_bytes: int) -> int:
    """Routing replay: bytes one token's routing costs in a buffer of ``dtype_bytes`` integers,
    MoE layers x top-k x dtype (the trainer holds int64 indices for its micro-batch, vLLM's capture
    buffer int32; samples carry the compact dtype, ``runtime.routing.routing_bytes_per_token``)."""
    return (shape.num_layers if layers is None else layers) * shape.moe_topk * dtype_bytes


def unfused_score_bytes(param_dtype: str) -> int:
    """Bytes an unfused attention keeps per attention score (per head, query and key position).

    Megatron's local attention (megatron-core 0.19.2 ``FusedScaleMaskSoftmax.forward_torch_softmax``
    with ``attention_softmax_in_fp32``, its default) computes the softmax of 16-bit scores in fp32
    and casts the probabilities back: autograd keeps the fp32 softmax output (4 bytes, for the
    softmax's backward) and the 16-bit probabilities (2, for the product with V). HF's eager
    attention does the same (softmax in fp32, then ``.to(query.dtype)``). In fp32 the two are one
    4-byte tensor. Counting only the 16-bit copy (2) planned a 0.6 B Qwen3 at seq 2048 on an H100
    ~8 GB under its measured peak (``docs/benchmarks/device-check.md``)."""
    return 4 if param_dtype == "float32" else 6


def _layer_activations(spec: TrainerMemorySpec, micro_batch_size: int) -> tuple[float, float]:
    """(one layer's activations of one micro-batch, its input hidden states), this rank's share."""
    shape = spec.shape
    s_full = spec.seq_length
    s, b, h, t = s_full / spec.cp, micro_batch_size, shape.hidden_size, spec.tp
    a, g, d = shape.num_attention_heads, shape.num_query_groups, shape.head_dim
    sbh = s * b * h
    replicated = 8 * sbh / (t if spec.sequence_parallel else 1)
    attention = (2 * s * b * (a + 2 * g) * d + 2 * s * b * a * d) / t
    if not spec.flash_attention and spec.recompute_granularity != "selective":
        attention += unfused_score_bytes(spec.param_dtype) * a * s * s_full * b / t
    if shape.is_moe:
        tokens = s * b / (t if spec.sequence_parallel else 1)
        mlp = shape.moe_topk * tokens * (2 * h + 6 * shape.moe_ffn_hidden_size)
    else:
        mlp = 6 * s * b * shape.ffn_hidden_size / t
    return replicated + attention + mlp, 2 * sbh / (t if spec.sequence_parallel else 1)


def _logits_bytes(spec: TrainerMemorySpec, micro_batch_size: int) -> float:
    """The last stage's logits of one micro-batch and the chunked log-softmax temporaries."""
    t = spec.tp
    vocab = spec.shape.padded_vocab(t, spec.make_vocab_size_divisible_by) / t
    s, b = spec.seq_length / spec.cp, micro_batch_size
    return 2 * s * b * vocab + LOGPROB_TEMPORARIES * 4 * min(LOGPROB_CHUNK, spec.seq_length * b) * vocab


def forward_activation_bytes(spec: TrainerMemorySpec, *, pp_rank: int = 0) -> float:
    """A forward-only pass (log-probs, no grad): one micro-batch of ``reference_micro_batch_size``,
    one layer's activations at a time plus the stage's input and output hidden states, and the
    logits on the last stage."""
    b = spec.reference_micro_batch_size or spec.micro_batch_size
    layer, hidden = _layer_activations(spec, b)
    total = layer + 2 * hidden
    if pp_rank == spec.pp - 1:
        total += _logits_bytes(spec, b)
    return float(total)


def activation_bytes(spec: TrainerMemorySpec, *, pp_rank: int = 0) -> float:
    """Activations kept for the backward pass of the micro-batches in flight (module docstring).

    Context parallelism: every per-token term holds this rank's seq_length / CP tokens; the
    unfused softmax (never used with CP on TE or MindSpeed, kept for the formula) is the rank's
    queries against every key. MoE: each routed token's hidden state visits topk experts (tokens
    are split over TP by sequence parallelism before dispatch; experts are whole, so no TP split
    inside them)."""
    per_layer, layer_input = _layer_activations(spec, spec.micro_batch_size)
    layers = spec.layers_on_stage(pp_rank)
    # Each micro-batch in flight keeps ``kept``; the one being back-propagated also rebuilds
    # ``working`` (full recomputation: one chunk's, or one layer's, full activations) once.
    working = 0.0
    if spec.recompute_granularity == "full":
        count = spec.recompute_num_layers or 1
        if spec.recompute_method == "block":  # the first `count` layers recompute, the rest keep all
            recomputed = min(count, layers)
            kept = recomputed * layer_input + (layers - recomputed) * per_layer
            working = per_layer if recomputed else 0.0
        else:  # uniform: chunks of `count` layers keep their inputs (each layer's, bounding it)
            kept = layers * layer_input
            working = min(count, layers) * per_layer
    else:
        kept = layers * per_layer
    in_flight = spec.pp - pp_rank  # 1F1B: stage i holds up to PP - i micro-batches
    total = in_flight * kept + working
    if pp_rank == spec.pp - 1:
        # Log-probs are chunked over every response token (each CP rank scores all of them).
        total += _logits_bytes(spec, spec.micro_batch_size)
    return float(total)


def rollout_memory(spec: RolloutMemorySpec, device_memory_gb: float) -> MemoryEstimate:
    """One vLLM engine worker: vLLM reserves ``gpu_memory_utilization`` of the device and gives
    its KV cache whatever the weights and its profiled activation peak leave of that."""
    shape = spec.shape
    pbytes = DTYPE_BYTES[spec.dtype]
    whole = rank_parameters(shape, tp=1, pp=1, ep=1, pp_rank=0, divisible_by=1)
    weights = pbytes * (whole.dense / spec.tp + whole.expert / (spec.expert_parallel or spec.tp))
    tokens = spec.max_num_batched_tokens
    width = shape.moe_topk * shape.moe_ffn_hidden_size if shape.is_moe else shape.ffn_hidden_size
    # Profiled peak of one forward over the token budget (hidden states, QKV, the MLP's widest
    # intermediate) plus the sampler's fp32 logits of every running sequence.
    activations = pbytes * tokens * (4 * shape.hidden_size + 3 * width) / spec.tp
    activations += 4 * spec.max_num_seqs * shape.vocab_size
    reserved = spec.gpu_memory_utilization * device_memory_gb * GB
    capture = 0.0
    if spec.routing_capture and shape.is_moe:
        capture = float(routing_buffer_bytes_per_token(shape, dtype_bytes=4) * tokens)
    kv_cache = max(0.0, reserved - weights - activations - capture)
    terms = {"weights": weights, "activations": activations, "kv_cache": kv_cache}
    if capture:
        terms["routing_capture"] = capture
    estimate = MemoryEstimate(terms=terms, budget=reserved)
    return estimate


def kv_bytes_per_token(shape: ModelShape, *, tp: int, dtype: str) -> float:
    """K and V of every layer for one token on one TP worker (KV heads split over TP)."""
    heads = max(1, shape.num_query_groups // tp)
    return 2 * shape.num_layers * heads * shape.head_dim * DTYPE_BYTES[dtype]


def rollout_shortfall(spec: RolloutMemorySpec, estimate: MemoryEstimate) -> str | None:
    """Why vLLM would refuse to start, or None: its KV cache must hold one ``max_model_len``
    sequence, and the weights plus activations must fit its reserved share."""
    needed = kv_bytes_per_token(spec.shape, tp=spec.tp, dtype=spec.dtype) * spec.max_model_len
    fixed = estimate.terms["weights"] + estimate.terms["activations"]
    if fixed + estimate.terms.get("routing_capture", 0.0) > estimate.budget:
        if fixed <= estimate.budget:
            return (
                "vLLM's routed-experts capture buffer (rl_config.routing_replay: R3) does not fit beside the "
                "weights and activations; lower generate_config.max_num_batched_tokens or turn routing replay off"
            )
        return "weights and activations exceed gpu_memory_utilization of the device"
    if estimate.terms["kv_cache"] < needed:
        return (
            f"KV cache {estimate.terms['kv_cache'] / GB:.2f} GB cannot hold one max_model_len="
            f"{spec.max_model_len} sequence ({needed / GB:.2f} GB)"
        )
    return None


# The trainer terms each ``offload_train_*`` part moves to host (``workers/colocation.py``).
OFFLOADED_TERMS = {"param": "parameters", "grad": "gradients", "optimizer": "optimizer_state"}
# What the ``offload_train_*`` switches do not move: the reference (0 in ``trainer_memory`` when
# it lives on the host between its passes, ``reference_offloaded``) and the process's runtime
# context and communicators.
ALWAYS_RESIDENT = ("reference",)
# The runtime context and communicator buffers a trainer process holds when its engine starts: an
# estimate, not a measurement. It is smaller than TRAINER_HEADROOM_GB, which also covers allocator
# slack at the training peak: the offload empties the allocator's cache before the engine starts.
# 3.0 GB here would refuse upstream's own integrated GRPO system test (gpu_memory_utilization 0.9 on
# a 64 GB device with everything but the reference offloaded: 3.8 + 3.0 > 6.4 GB), a config
# upstream runs on its hardware; 1.5 GB accepts it.
START_CONTEXT_GB = 1.5


@dataclass(frozen=True, slots=True, kw_only=True)
class ColocatedStart:
    """One colocated trainer rank's device memory along the sequence ``workers/colocation.py``
    performs: the trainer is built, its ``offload_train_*`` parts leave, then the rollout engine
    starts; vLLM (and vllm-ascend) refuse to start unless ``gpu_memory_utilization`` x device
    memory is free, so what the trainer keeps must fit in the rest (``allowed``). Every later
    generate phase holds the same parts, so ``resident`` counts the optimizer state in full (at
    the very start only the fp32 masters exist; the moments come with the first step). Each push
    of new weights then wakes the engine's weights while the parameters are still on the device
    (``push_peak``, against the whole device)."""

    resident: Mapping[str, float]
    allowed: float
    push_peak: float
    device: float

    @property
    def total(self) -> float:
        return sum(self.resident.values())

    def starts(self) -> bool:
        return self.total <= self.allowed

    def pushes(self) -> bool:
        return self.push_peak <= self.device

    def as_gb(self) -> dict[str, Any]:
        return {
            "resident_at_engine_start": round(self.total / GB, 2),
            **{k: round(v / GB, 2) for k, v in self.resident.items()},
            "allowed": round(self.allowed / GB, 2),
            "push_peak": round(self.push_peak / GB, 2),
            "device": round(self.device / GB, 2),
        }


def colocated_start(
    trainer: MemoryEstimate,
    rollout: MemoryEstimate,
    offloaded: Collection[str],
    *,
    gpu_memory_utilization: float,
    device_memory_gb: float,
    swapped_optimizer: bool = False,
) -> ColocatedStart:
    """``trainer`` (``trainer_memory``) and ``rollout`` (``rollout_memory``) of one rank, with
    ``offloaded`` the ``offload_train_*`` parts ("param", "grad", "optimizer") that are on;
    ``swapped_optimizer``: MindSpeed's swap optimizer keeps the state on the host between steps."""
    gone = {OFFLOADED_TERMS[part] for part in offloaded}
    if swapped_optimizer:
        gone.add(OFFLOADED_TERMS["optimizer"])  # on the host between steps (``swap_chunk``)
    kept = [*(t for t in OFFLOADED_TERMS.values() if t not in gone), *ALWAYS_RESIDENT]
    resident = {term: trainer.terms[term] for term in kept}
    resident["runtime_context"] = START_CONTEXT_GB * GB
    device = device_memory_gb * GB
    # During the push the parameters are still on the device (offloaded after it, if at all).
    params_during_push = trainer.terms["parameters"] if "parameters" in gone else 0.0
    return ColocatedStart(
        resident=resident,
        allowed=(1.0 - gpu_memory_utilization) * device,
        push_peak=sum(resident.values()) + params_during_push + rollout.terms["weights"],
        device=device,
    )


# The key that shrinks each trainer term the most, for the error message.
SHRINK_HINTS = {
    "parameters": "raise actor_config.tensor_model_parallel_size / pipeline_model_parallel_size "
    "(or expert_model_parallel_size for MoE)",
    "gradients": "raise the model-parallel sizes, or leave accumulate_allreduce_grads_in_fp32 off",
    "optimizer_state": "set actor_config.use_distributed_optimizer: true (shards it over data parallel)",
    "optimizer_state_sharded": "the distributed optimizer already shards it, over {dp} data-parallel rank(s) "
    "(world {world} / (TP {tp} x PP {pp})): add ranks for more data parallelism, or on NPU set "
    "megatron_training.swap_optimizer: true (MindSpeed keeps it on the host between steps)",
    "reference": "raise the model-parallel sizes (the reference is sharded like the policy)",
    "activations": "set actor_config.recompute_granularity: full (and sequence_parallel: true at TP > 1), "
    "raise actor_config.context_parallel_size, or lower micro_batch_size / seq_length",
    "headroom": "use a device with more memory",
    "runtime_context": "use a device with more memory",
}
