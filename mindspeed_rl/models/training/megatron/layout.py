"""The parallel layout of the megatron training backend (torch-free: the config mapper builds it),
and :func:`check_trainable`, the refusal of layouts the chosen layer spec cannot train."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal, Protocol

DeviceKind = Literal["cpu", "cuda", "npu"]
SpecKind = Literal["local", "transformer_engine"]

RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronLayout:
    """``actor_config`` parallel sizes and the megatron switches the engine honours; DP is what
    the world size leaves over. Every switch defaults to off, which is the CPU build."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    """Megatron defaults expert TP to attention TP; 1 keeps whole experts per EP rank (SequentialMLP
    on CPU), which is what the convert merge and the HF per-expert names want."""
    context_parallel_size: int = 1
    """Ranks one sequence is split over (``cp_support``); their attention is TE's or MindSpeed's."""
    context_parallel_algo: str = "megatron_cp_algo"
    """Upstream's ``context_parallel_algo`` (``cp_support.SUPPORTED_ALGOS``); read only at CP > 1."""
    make_vocab_size_divisible_by: int = 128
    stage_layers: tuple[int, ...] = ()
    """Real layers per pipeline stage (``stages.stage_layers``: num_layer_list minus noop layers);
    () = num_layers / PP each, megatron's own split."""
    sequence_parallel: bool = False
    """Shard activations along the sequence over the TP group (needs TP > 1)."""
    recompute_granularity: str | None = None
    """``full`` (whole layers, with ``recompute_method`` and ``recompute_num_layers``) or
    ``selective`` (megatron's core-attention recompute)."""
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    use_flash_attn: bool = False
    """Flash attention: TransformerEngine's on CUDA, MindSpeed's ``npu_fusion_attention`` on NPU."""
    use_fused_rmsnorm: bool = False
    use_fused_swiglu: bool = False
    use_fused_rotary_pos_emb: bool = False
    """The fused kernels are MindSpeed's (NPU); on CUDA TransformerEngine fuses the norm itself and
    the SwiGLU / RoPE switches select megatron's fusions; on CPU they change nothing."""
    swap_optimizer: bool = False
    """MindSpeed's swap optimizer (NPU, upstream's ``swap_optimizer``; needs the distributed
    optimizer): the fp32 master shards and Adam moments live in pinned host memory, and each step
    brings them to the device in chunks of 1/``swap_optimizer_times`` of the rank's shard
    (MindSpeed 26.1.0_core_r0.12.1, core/optimizer/swap_optimizer/swap_optimizer.py)."""

    def __post_init__(self) -> None:
        sizes = {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "make_vocab_size_divisible_by": self.make_vocab_size_divisible_by,
        }
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad:
            raise ValueError(f"actor_config parallel sizes must be >= 1; got {bad}")
        stages = self.stage_layers
        if stages and (len(stages) != self.pipeline_model_parallel_size or min(stages) < 1):
            raise ValueError(
                f"stage_layers {stages} must give >= 1 layer to each of the "
                f"{self.pipeline_model_parallel_size} pipeline stages"
            )

    def layers_per_stage(self, num_layers: int) -> tuple[int, ...]:
        """Real layers of every stage of a ``num_layers``-layer model."""
        if self.stage_layers:
            return self.stage_layers
        pp = self.pipeline_model_parallel_size
        return (num_layers // pp,) * pp

    @property
    def model_parallel_size(self) -> int:
        """Ranks of one dense model replica (TP x PP)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def data_parallel_size(self, world_size: int) -> int:
        """DP replicas; each holds TP x PP x CP ranks (megatron's rank order, CP inside DP)."""
        mp = self.model_parallel_size * self.context_parallel_size
        expert = (
            self.expert_model_parallel_size
            * self.expert_tensor_parallel_size
            * self.pipeline_model_parallel_size
        )
        if world_size % mp or world_size % expert:
            raise ValueError(
                f"world size {world_size} is not a multiple of TP x PP x CP = {mp} and EP x ETP x PP = {expert}; "
                "give the Training Unit a number of ranks that both divide (actor_config parallel sizes)"
            )
        return world_size // mp


class _ModelTraits(Protocol):
    """What :func:`check_trainable` needs of a model: ``GPTDims`` has both."""

    @property
    def is_moe(self) -> bool: ...

    @property
    def num_layers(self) -> int: ...


def transformer_engine_importable() -> bool:
    """Whether this process can import TransformerEngine's PyTorch side (without importing it).

    TE is two installs on the GPU stacks: the ``transformer-engine`` wheels (pure Python plus the
    CUDA core) and its compiled torch extension ``transformer_engine_torch`` (source-only on
    PyPI, built against the installed torch as a separate step). With the first alone,
    ``transformer_engine.pytorch`` fails at import (TE 2.20.2 imports the extension throughout);
    that half install is refused here with the missing step, not taken for "no TE".
    """
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    if importlib.util.find_spec("transformer_engine_torch") is None:
        raise ValueError(
            "TransformerEngine is installed without its PyTorch extension (the "
            "transformer_engine_torch module), so the TE layer spec cannot be built; install it "
            "against this torch: pip install --no-build-isolation transformer-engine-torch==<the "
            "transformer-engine version> (stacks/gpu-trainer.txt, last step), or uninstall "
            "transformer-engine to train with the local spec"
        )
    return True


def spec_kind(device_kind: DeviceKind, *, transformer_engine: bool | None = None) -> SpecKind:
    """The layer spec the engine builds on ``device_kind``.

    - cuda: TransformerEngine's spec when ``transformer_engine`` is importable, else the local one;
    - npu: the local spec. MindSpeed (release 26.1.0_core_r0.12.1) replaces the local spec's
      norms by its own SP-capable RMSNorm (``megatron_basic``'s PTNorm patch of ``LNImpl`` and
      ``WrappedTorchNorm``) and patches ``DotProductAttention.forward`` with its flash attention;
      its TE-spec path swaps in NPU modules only with fp8 (``transformer_engine_basic``), so the
      TE spec is not what it supports for bf16 training;
    - cpu: the local spec.

    ``transformer_engine`` None asks this process; pass the answer of the training hosts when
    they differ from the caller's (``check_config`` on a driver without TE, for instance).
    """
    if device_kind != "cuda":
        return "local"
    have_te = transformer_engine_importable() if transformer_engine is None else transformer_engine
    return "transformer_engine" if have_te else "local"


def _spec_supports_sequence_parallel(device_kind: DeviceKind, spec: SpecKind) -> bool:
    # The local spec's norm is megatron's WrappedTorchNorm, which asserts `not sequence_parallel`
    # (megatron-core 0.12.1 and 0.19.2, transformer/torch_norm.py); MindSpeed replaces it on NPU.
    return spec == "transformer_engine" or device_kind == "npu"


def check_trainable(
    model: _ModelTraits | bool,
    layout: MegatronLayout,
    device_kind: DeviceKind,
    *,
    transformer_engine: bool | None = None,
    cp_stand_in: bool = False,
) -> None:
    """Raise ValueError, naming the keys and the fix, if ``layout`` cannot train on ``device_kind``.

    ``model``: the model's ``GPTDims`` (or anything with ``is_moe`` and ``num_layers``), or just
    whether it is a MoE model when the checkpoint's config has not been read yet (the recompute
    layer count is then checked against megatron at build time only). ``transformer_engine``: as
    in :func:`spec_kind`. ``cp_stand_in``: the CPU test's CP attention stand-in is registered
    (``cp_support.cp_problems``). Pure (no torch, no megatron): ``check_config`` calls it before any
    heavy work; the model build calls it too, so both refuse the same layouts.
    """
    is_moe = model if isinstance(model, bool) else model.is_moe
    num_layers = None if isinstance(model, bool) else model.num_layers
    spec = spec_kind(device_kind, transformer_engine=transformer_engine)
    tp = layout.tensor_model_parallel_size
    problems: list[str] = []
    if layout.sequence_parallel and tp == 1:
        problems.append(
            "actor_config.sequence_parallel: true needs tensor_model_parallel_size > 1 (it shards "
            "activations over the TP group); set sequence_parallel: false or raise "
            "tensor_model_parallel_size"
        )
    if layout.sequence_parallel and not _spec_supports_sequence_parallel(device_kind, spec):
        where = "CPU" if device_kind == "cpu" else "CUDA without TransformerEngine"
        problems.append(
            f"actor_config.sequence_parallel: true cannot be built on {where}: the local layer spec's "
            "torch RMSNorm refuses sequence parallelism (it needs TransformerEngine's norm on CUDA or "
            "MindSpeed's on NPU); set sequence_parallel: false"
        )
    needs_sp = is_moe or layout.expert_model_parallel_size > 1
    if needs_sp and tp > 1 and not layout.sequence_parallel:
        # MoELayer refuses to train at TP > 1 without SP (both versions), and megatron-core
        # 0.12.1's ModelParallelConfig refuses EP > 1 with TP > 1 without SP.
        if _spec_supports_sequence_parallel(device_kind, spec):
            fix = "set actor_config.sequence_parallel: true"
        else:
            fix = (
                "this build cannot run sequence parallelism, so keep tensor_model_parallel_size: 1 and "
                "shard the model with expert_model_parallel_size (and data/pipeline parallel)"
            )
        problems.append(
            f"a {'MoE model' if is_moe else 'layout with expert_model_parallel_size > 1'} at "
            f"tensor_model_parallel_size={tp} needs actor_config.sequence_parallel: true "
            f"(megatron's MoE layer refuses TP > 1 without it in training); {fix}"
        )
    if num_layers is not None and layout.stage_layers and sum(layout.stage_layers) != num_layers:
        problems.append(
            f"the pipeline stages hold {sum(layout.stage_layers)} real layers ({layout.stage_layers}: "
            f"actor_config.num_layer_list without noop_layers) but the model has {num_layers}; make "
            "num_layers minus the noop layers equal the model's layer count"
        )
    problems += _recompute_problems(
        layout, None if num_layers is None else layout.layers_per_stage(num_layers)
    )
    if layout.use_flash_attn and device_kind != "npu" and spec != "transformer_engine":
        where = "CPU" if device_kind == "cpu" else "CUDA without TransformerEngine"
        problems.append(flash_attention_refusal(where))
    from mindspeed_rl.models.training.megatron.cp_support import cp_problems

    problems += cp_problems(
        layout.context_parallel_size, layout.context_parallel_algo, device_kind, spec, stand_in=cp_stand_in
    )
    if problems:
        raise ValueError("; ".join(problems))


def flash_attention_refusal(where: str) -> str:
    """Why ``use_flash_attn: true`` cannot train where the local spec runs without MindSpeed
    (also raised by ``attention.attention_choice``, so the plan and the build say the same)."""
    return (
        f"actor_config.use_flash_attn: true has no kernel on {where} (the local spec's attention "
        "is megatron's unfused one); set use_flash_attn: false"
    )


def _recompute_problems(layout: MegatronLayout, stages: tuple[int, ...] | None) -> list[str]:
    # megatron-core 0.12.1 and 0.19.2 TransformerConfig.__post_init__ apply the same rules.
    granularity, method, count = (
        layout.recompute_granularity,
        layout.recompute_method,
        layout.recompute_num_layers,
    )
    if granularity is None:
        if method is not None or count is not None:
            return [
                "actor_config.recompute_method / recompute_num_layers need "
                "actor_config.recompute_granularity: full; set it or unset them"
            ]
        return []
    if granularity not in RECOMPUTE_GRANULARITIES:
        return [
            f"actor_config.recompute_granularity must be one of {RECOMPUTE_GRANULARITIES}, got {granularity!r}"
        ]
    if granularity == "selective":
        if method is not None or count is not None:
            return [
                "actor_config.recompute_granularity: selective recomputes core attention only; "
                "unset recompute_method and recompute_num_layers (they belong to granularity full)"
            ]
        return []
    problems = []
    if method not in RECOMPUTE_METHODS:
        problems.append(
            f"actor_config.recompute_granularity: full needs recompute_method in {RECOMPUTE_METHODS}, "
            f"got {method!r}"
        )
    # block recomputes the first count layers of a stage (a count past a shorter stage's layers
    # is all of them); uniform chunks of count layers must fit in every stage (megatron-core
    # 0.12.1 runs a chunk past a stage's last layer into an IndexError; 0.19.2 clips it).
    layers_per_stage = None if stages is None else (max(stages) if method == "block" else min(stages))
    if count is None or count < 1 or (layers_per_stage is not None and count > layers_per_stage):
        bound = "the layers per pipeline stage" if layers_per_stage is None else str(layers_per_stage)
        problems.append(
            f"actor_config.recompute_granularity: full needs recompute_num_layers between 1 and {bound} "
            f"(the real layers of a pipeline stage), got {count!r}"
        )
    return problems
