"""The specs a run hands its workers: what the Training Unit, a generation actor, the evaluator
and the colocated worker receive, and nothing else of the config.

They sit below ``workers/`` and ``trainer/`` (both import them; neither is imported here), are
built by the run plan (``plan/build.py``) and cross process boundaries, so they are frozen plain
dataclasses. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.tools.agent_loop import AgentSettings
from mindspeed_rl.tools.config import ToolEntry

OldLogProbs = Literal["rollout", "recompute", "current"]
RoutingReplay = Literal["R2", "R3"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerSpec:
    """What the Training Unit needs; nothing else of the config reaches it."""

    engine: TorchEngineConfig
    reward: RewardConfig
    reference_micro_batch_size: int | None
    """None: no KL anywhere, so no reference model is loaded."""
    offload_reference: bool = False
    """The reference's weights live on the host except during its log-prob pass
    (``rl_config.use_integrated_worker``, as upstream's integrated worker does)."""
    temperature: float
    """Sampling temperature: log-probs are of the temperature-scaled distribution."""
    n_samples_per_prompt: int
    adv_estimator: Literal["group_norm"]
    old_log_probs: OldLogProbs
    """Which log-probs the ratio is taken against (see TrainingUnit)."""
    num_cpus: float
    """The worker's CPU request; sets its torch threads."""
    megatron: MegatronLayout | None = None
    """``use_mcore_models: true``: the megatron engine with this layout, one Training Unit per rank
    of a ``TrainingGroup`` of ``num_ranks``; None: the torch engine in one process."""
    num_ranks: int = 1
    """Ranks of the Training Unit (TP x PP x DP of the megatron layout; 1 for the torch engine)."""
    routing_replay: RoutingReplay | None = None
    """``rl_config.routing_replay``: R3 replays the rollout's routing (``Sample.routing``) in every
    forward; R2 replays the routing the trainer's own log-prob recompute chose. None: off."""

    def layout_summary(self) -> dict[str, int]:
        """The parallel layout for summary.json (the torch engine: one rank)."""
        m = self.megatron
        if m is None:
            return {"tp": 1, "pp": 1, "ep": 1, "dp": 1}
        return {
            "tp": m.tensor_model_parallel_size,
            "pp": m.pipeline_model_parallel_size,
            "ep": m.expert_model_parallel_size,
            "dp": m.data_parallel_size(self.num_ranks),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DynamicSampling:
    """DAPO's dynamic sampling (``rl_config.filter_groups_*``): a prompt group whose ``metric``
    scores are all equal carries no GRPO signal (every advantage is 0), so it is dropped, counted,
    and more prompts are generated until a step holds ``train_batch_prompts`` kept groups."""

    metric: str
    """The verifier whose per-sample score the rollout attaches (``Sample.filter_score``)."""
    max_batches: int | None
    """Generation batches one trainer step may use before the run stops; None = no limit."""
    train_batch_prompts: int
    generation_batch_prompts: int
    """Prompts per generation batch (``global_batch_size``): the unit ``max_batches`` counts in."""
    scorer: RewardConfig
    """``metric`` alone, weight 1: what each generation actor scores its samples with."""

    def max_prompts_per_step(self) -> int | None:
        return None if self.max_batches is None else self.max_batches * self.generation_batch_prompts


@dataclass(frozen=True, slots=True, kw_only=True)
class PartialRollout:
    """``rl_config.partial_rollout_max_split`` and the round length a generation actor decodes in
    (``workers.partial_rollout``)."""

    max_split: int
    chunk_tokens: int

    def __post_init__(self) -> None:
        if self.max_split < 2:
            raise ValueError(
                f"partial rollouts with max_split={self.max_split}: use 2 or more (1 = no partial rollouts, "
                "then no PartialRollout is built)"
            )
        if self.chunk_tokens < 1:
            raise ValueError(f"rl_config.partial_rollout_chunk_tokens={self.chunk_tokens}; use 1 or more")

    @staticmethod
    def auto_chunk(max_tokens: int) -> int:
        """A quarter of the response cap: a refresh waits at most a quarter of the longest answer."""
        return max(1, math.ceil(max_tokens / 4))


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiTurnSpec:
    """``rl_config.multi_turn_enable``: what a generation actor needs to run the agent loop
    (``tools.agent_loop``). The tools travel as checked config entries; each actor builds its own."""

    settings: AgentSettings
    parser: str
    """A registered tool-call parser (``tools.parsers``)."""
    tools: tuple[ToolEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSpec:
    """What a generation actor needs."""

    backend: Literal["vllm", "hf"]
    engine_keys: Mapping[str, Any]
    """``generate_config`` engine keys, in upstream names (``rollout.factory`` maps them)."""
    sampling: SamplingConfig
    n_samples_per_prompt: int
    num_cpus: float
    seed: int
    filter_scorer: RewardConfig | None = None
    """Dynamic sampling: the filter metric each sample is scored with (``DynamicSampling.scorer``)."""
    partial: PartialRollout | None = None
    """Partial rollouts (async only); None: every response finishes on its starting weights."""
    multi_turn: MultiTurnSpec | None = None
    """Multi-turn rollouts with tools; None: one model turn per response."""
    record_routing: bool = False
    """Routing replay R3: the engine records each sample's MoE routing (``Sample.routing``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalConfig:
    interval: int | None = None
    """``megatron_training.eval_interval``: iterations between evaluations; None = no evaluation."""
    num_samples_per_prompt: int = 1
    """Samples per held-out prompt; accuracy is pass@1 averaged over them."""
    max_prompts: int | None = None
    """Held-out prompts per evaluation (``eval_iters`` x global batch); None = all of them."""

    def __post_init__(self) -> None:
        if self.interval is not None and self.interval < 1:
            raise ValueError(
                f"megatron_training.eval_interval={self.interval}; use a positive number of "
                "iterations, or null for no evaluation"
            )
        if self.num_samples_per_prompt < 1:
            raise ValueError(
                f"evaluation num_samples_per_prompt={self.num_samples_per_prompt}; use 1 or more"
            )
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(
                f"evaluation max_prompts={self.max_prompts} (eval_iters x global batch); use 1 or more, "
                "or eval_iters: 0 for every held-out prompt"
            )

    def due(self, iteration: int) -> bool:
        """Evaluate after 0-based iteration ``iteration``? Every ``interval``-th, counting from 1
        as Megatron does (interval 5 -> after iterations 4, 9, ...), never before training."""
        return self.interval is not None and (iteration + 1) % self.interval == 0


OffloadPart = Literal["optimizer", "grad", "param"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSpec:
    """Which training state goes to host memory while the rollout engine generates."""

    optimizer: bool = False
    """``offload_train_optimizer``: Adam moments (and fp32 master weights under bf16)."""
    grad: bool = False
    """``offload_train_grad``: gradients kept between steps."""
    param: bool = False
    """``offload_train_param``: the model parameters (after they were pushed to the engine)."""

    def before_push(self) -> tuple[OffloadPart, ...]:
        chosen: tuple[tuple[OffloadPart, bool], ...] = (("optimizer", self.optimizer), ("grad", self.grad))
        return tuple(part for part, on in chosen if on)

    def after_push(self) -> tuple[OffloadPart, ...]:
        return ("param",) if self.param else ()

    def all_parts(self) -> tuple[OffloadPart, ...]:
        """Reload order: params first (optimizer masters are built from nothing else, but a
        step needs every part back; params are what the next forward pass touches first)."""
        return (*self.after_push(), *self.before_push())
