"""Context parallelism (CP): which of upstream's ``context_parallel_algo`` values this stack runs,
how each splits a sequence, and what a device needs for its attention. Pure (no torch, no
megatron): ``check_config`` asks it before any heavy work, and the model build asks it again.

The attention across CP ranks is never ours: TransformerEngine's on CUDA (megatron-core 0.19.2's
``TEDotProductAttention`` passes ``cp_group`` / ``cp_comm_type`` to TE's ``DotProductAttention``),
MindSpeed's on NPU (26.1.0_core_r0.12.1: ``--context-parallel-algo`` picks its ring or Ulysses
attention). megatron's own (local) ``DotProductAttention`` asserts ``context_parallel_size == 1``,
so on CPU no CP layout builds, except in the CPU test, which registers an attention stand-in of
its own (``context_parallel.set_attention_stand_in``).

Upstream's algorithms (MindSpeed's ``--context-parallel-algo`` choices):

- ``megatron_cp_algo``: ring attention over the zigzag (load-balanced) split: the sequence cut
  into ``2 * CP`` chunks, rank ``r`` holding chunks ``r`` and ``2 * CP - 1 - r``, as megatron-core's
  ``get_batch_on_this_cp_rank`` and ``get_pos_emb_on_this_cp_rank`` do. TE: ``cp_comm_type`` p2p.
- ``ulysses_cp_algo`` (upstream's default): all-to-all over heads. MindSpeed splits the sequence
  in ``CP`` contiguous parts (its ``_get_batch_on_this_cp_rank_in_ulysses_cp``); TE's a2a keeps
  megatron's zigzag split. TE: ``cp_comm_type`` a2a.
- ``hybrid_cp_algo`` (Ulysses inside ring, ``ulysses_degree_in_cp``), ``adaptive_cp_algo`` and
  ``hybrid_adaptive_cp_algo``: refused by name (see :data:`REFUSED_ALGOS`).
"""

from __future__ import annotations

from typing import Literal

from mindspeed_rl.models.training.megatron.layout import DeviceKind, SpecKind

SplitKind = Literal["zigzag", "contiguous"]

SUPPORTED_ALGOS: dict[str, str] = {
    "megatron_cp_algo": "p2p",
    "ulysses_cp_algo": "a2a",
}
"""upstream algorithm -> TransformerEngine's ``cp_comm_type`` (megatron-core 0.19.2
``TransformerConfig.cp_comm_type``)."""

REFUSED_ALGOS: dict[str, str] = {
    "hybrid_cp_algo": (
        "Ulysses inside ring needs a second CP group layout (MindSpeed's ulysses_degree_in_cp, TE's "
        "hierarchical_context_parallel_sizes) that the engine does not build"
    ),
    "adaptive_cp_algo": "MindSpeed's adaptive CP builds data-dependent attention masks the engine does not pass",
    "hybrid_adaptive_cp_algo": "MindSpeed's adaptive CP builds data-dependent attention masks the engine does not pass",
}

INSTALL_CUDA = (
    "TransformerEngine 2.20.2 for its context-parallel attention (stacks/gpu-trainer.txt: "
    "transformer-engine, then transformer-engine-torch built against this torch)"
)
INSTALL_NPU = (
    "MindSpeed 26.1.0_core_r0.12.1 (stacks/ascend-trainer.txt, make setup-npu) for its ring and Ulysses "
    "CP attention"
)


def split_kind(algo: str, device_kind: DeviceKind) -> SplitKind:
    """How a sequence is cut over the CP ranks: MindSpeed's Ulysses cuts contiguous parts; every
    other supported combination is megatron's zigzag."""
    return "contiguous" if device_kind == "npu" and algo == "ulysses_cp_algo" else "zigzag"


def width_multiple(cp: int, kind: SplitKind) -> int:
    """A micro-batch's width must divide into the split's chunks: ``2 * CP`` (zigzag) or ``CP``."""
    return 2 * cp if kind == "zigzag" else cp


def cp_problems(
    cp: int,
    algo: str,
    device_kind: DeviceKind,
    spec: SpecKind,
    *,
    stand_in: bool = False,
) -> list[str]:
    """Why a CP layout cannot train here (empty when it can): the algorithm, then the attention.

    ``stand_in``: a CP attention stand-in is registered (the CPU test's; never in a real run)."""
    if cp == 1:
        return []
    if cp < 1:
        return [f"actor_config.context_parallel_size must be >= 1, got {cp}"]
    key = f"actor_config.context_parallel_size={cp} with context_parallel_algo {algo}"
    if algo in REFUSED_ALGOS:
        choices = " or ".join(SUPPORTED_ALGOS)
        return [f"{key}: not supported ({REFUSED_ALGOS[algo]}); set context_parallel_algo: {choices}"]
    if algo not in SUPPORTED_ALGOS:
        known = sorted({*SUPPORTED_ALGOS, *REFUSED_ALGOS})
        return [
            f"{key}: unknown algorithm; upstream's are {known}, of which {sorted(SUPPORTED_ALGOS)} run here"
        ]
    if stand_in:
        return []
    if device_kind == "cpu":
        return [
            f"{key}: context parallelism has no attention kernel on CPU (megatron's local attention "
            f"refuses CP); train it on CUDA with {INSTALL_CUDA}, or on NPU with {INSTALL_NPU}; or set "
            "context_parallel_size: 1"
        ]
    if device_kind == "cuda" and spec != "transformer_engine":
        return [
            f"{key}: CUDA without TransformerEngine has no context-parallel attention (megatron's local "
            f"attention refuses CP); install {INSTALL_CUDA}, or set context_parallel_size: 1"
        ]
    return []
