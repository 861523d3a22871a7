"""The parallel layout of the megatron training backend (torch-free: the config mapper builds it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronLayout:
    """``actor_config`` parallel sizes; DP is what the world size leaves over."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    """Megatron defaults expert TP to attention TP; 1 keeps whole experts per EP rank (SequentialMLP
    on CPU), which is what the convert merge and the HF per-expert names want."""
    make_vocab_size_divisible_by: int = 128

    def __post_init__(self) -> None:
        sizes = {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
            "make_vocab_size_divisible_by": self.make_vocab_size_divisible_by,
        }
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad:
            raise ValueError(f"actor_config parallel sizes must be >= 1; got {bad}")

    @property
    def model_parallel_size(self) -> int:
        """Ranks of one dense model replica (TP x PP)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def data_parallel_size(self, world_size: int) -> int:
        mp = self.model_parallel_size
        expert = (
            self.expert_model_parallel_size
            * self.expert_tensor_parallel_size
            * self.pipeline_model_parallel_size
        )
        if world_size % mp or world_size % expert:
            raise ValueError(
                f"world size {world_size} is not a multiple of TP x PP = {mp} and EP x ETP x PP = {expert}; "
                "give the Training Unit a number of ranks that both divide (actor_config parallel sizes)"
            )
        return world_size // mp
