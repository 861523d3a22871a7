"""MoE routing replay in the megatron engine, through megatron-core's own router replay.

Written against megatron-core 0.19.2 (transformer/moe/router_replay.py, moe/router.py,
moe/moe_utils.py): ``TransformerConfig.moe_enable_routing_replay`` gives every ``TopKRouter`` a
``RouterReplay`` (``router.router_replay``, its ``layer_number`` the global 1-based layer). With
the action ``REPLAY_FORWARD`` and ``set_target_indices([tokens, top_k])``, the router's top-k is
replaced by the targets and its probabilities gathered at them (``topk_routing_with_score_function``:
top-k logits then softmax, or softmax then gather under ``moe_router_pre_softmax``), so the gradient
still reaches the router weights through the chosen experts. megatron-core 0.12.1 (MindSpeed's NPU
stack) has no router replay: :func:`check_replayable` refuses it by name.

How a sample's record (``runtime.routing`` rows, ``[prompt + response - 1, moe_layers, top_k]``)
reaches each router of a rank::

    micro-batch [B, S] right-padded (+ filler rows)   ->  [B, S, L, K], -1 where nothing is recorded
      this stage's routers: layers layer_number - 1   ->  [B, S, L_stage, K]
      context parallel: this CP rank's positions      ->  [B, S_cp, ...]
      sequence parallel: TP rank r's chunk of them    ->  [B, S_cp / tp, ...]
      megatron's token order (sequence-major [S, B])  ->  per layer [S_local * B, K]

Rows without a record (padding, the last response token, a DP rank's filler rows) must still name
valid experts for megatron's gather: they get experts ``0..K-1``. No scored log-prob depends on them
(right padding under a causal mask, the allgather/alltoall dispatchers drop no tokens), unlike the
torch engine, where they keep the router's own choice.

What the routers actually used is read from each router's output (``routing_map``, the experts
the dispatcher sends the token to), not from the targets, in a forward hook that also recomputes
the router's own top-k for the ``router_disagree_frac`` metric. Each rank keeps the rows it owns
(its DP samples, its stage's layers, its CP/SP positions; TP ranks without sequence parallelism
see the same tokens, so TP rank 0 alone keeps them) and :meth:`ReplayPass.gather` merges them on
every rank over the host group.

Activation recompute: megatron-core 0.19.2 switches no router to ``REPLAY_BACKWARD`` by itself,
so a recomputed forward replays the targets last set. Without pipelining the last ones set are the
micro-batch's own (forward, then its backward); under a pipeline schedule later forwards come
between, so :func:`check_replayable` refuses recompute with pipeline parallelism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.training.megatron import context_parallel
from mindspeed_rl.models.training.megatron.groups import host_group

if TYPE_CHECKING:
    from mindspeed_rl.models.training.megatron.forward import Micro


def replay_config_kwargs(config_class: Any, *, is_moe: bool) -> dict[str, Any]:
    """``moe_enable_routing_replay`` for a MoE model where this megatron-core has it (0.19.2): the
    routers then carry a ``RouterReplay`` whose action is None until a pass sets one, which routes
    exactly as without it, so it is on for every MoE model (the reference's routers need it too)."""
    import dataclasses

    if is_moe and "moe_enable_routing_replay" in {f.name for f in dataclasses.fields(config_class)}:
        return {"moe_enable_routing_replay": True}
    return {}


@dataclass(frozen=True, slots=True)
class _Router:
    module: torch.nn.Module
    replay: Any
    """megatron-core's ``RouterReplay`` of this router."""
    layer: int
    """Index into the record's layer axis (every decoder layer of a Qwen3-MoE is a MoE layer,
    ``weights.megatron_dims`` refuses other patterns): ``layer_number - 1``."""


def stage_routers(model: torch.nn.Module) -> list[_Router]:
    """This rank's MoE routers (its pipeline stage's layers) in layer order."""
    found = []
    for module in model.modules():
        router: Any = module
        replay = getattr(module, "router_replay", None)
        if replay is not None and getattr(module, "topk", None) is not None:
            found.append(_Router(module=module, replay=replay, layer=int(router.layer_number) - 1))
    return sorted(found, key=lambda r: r.layer)


def check_replayable(model: torch.nn.Module) -> None:
    """ValueError naming the problem where this model cannot replay routing."""
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    if not getattr(config, "num_moe_experts", None):
        raise ValueError(
            "routing replay needs a MoE model; this one is dense (no num_experts): set "
            "rl_config.routing_replay: null"
        )
    if not getattr(config, "moe_enable_routing_replay", False):
        raise ValueError(
            "this megatron-core has no router replay (TransformerConfig.moe_enable_routing_replay, "
            "added by 0.19.2's transformer/moe/router_replay.py; MindSpeed's 0.12.1 lacks it): set "
            "rl_config.routing_replay: null, or train with megatron-core 0.19.2 (the gpu-trainer stack)"
        )
    if config.recompute_granularity is not None and config.pipeline_model_parallel_size > 1:
        raise ValueError(
            "routing replay with activation recompute under pipeline parallelism: megatron-core 0.19.2 "
            "recomputes a micro-batch's forward after later micro-batches set their routing, so it would "
            "replay the wrong routing; unset actor_config.recompute_granularity or use "
            "pipeline_model_parallel_size 1"
        )


def local_positions(width: int, device: torch.device, model_config: Any) -> torch.Tensor:
    """The sequence positions this rank's routers see, in their token order (module docstring)."""
    from megatron.core import parallel_state as ps

    mine = context_parallel.local_positions(width, device)
    positions = torch.arange(width, device=device) if mine is None else mine
    if model_config.sequence_parallel:
        tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        chunk = positions.numel() // tp
        positions = positions[rank * chunk : (rank + 1) * chunk]
    return positions


@dataclass(slots=True)
class ReplayStats:
    """Replayed (row, layer) pairs this rank owns, and how many its router alone would have routed
    to another expert set."""

    replayed: int = 0
    natural_differs: int = 0


@dataclass(slots=True)
class _Current:
    """The micro-batch whose forward runs now on this rank."""

    micro: Micro
    positions: torch.Tensor
    recorded: torch.Tensor | None
    """``[B, S_local, L_all, K]`` record laid out like the routers' tokens (-1: none), or None."""


@dataclass(slots=True)
class ReplayPass:
    """One pass of micro-batches (log-prob scoring, reference, or update) over one model.

    ``replay``: route each micro-batch by its ``batch.routing``; ``capture``: keep what the routers
    used for :meth:`gather`. Enter :meth:`session` around the pass and :meth:`micro` around each
    micro-batch's model call (``forward.run_micros``'s ``around_forward``)."""

    model: torch.nn.Module
    replay: bool
    capture: bool
    stats: ReplayStats = field(default_factory=ReplayStats)
    _routers: list[_Router] = field(default_factory=list)
    _current: _Current | None = None
    _owner: bool = True
    _rows: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = field(default_factory=dict)
    """sample index -> [(record layer, positions, [len(positions), K] experts used)]."""

    @contextlib.contextmanager
    def session(self) -> Iterator[ReplayPass]:
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.moe.router_replay import RouterReplayAction
        from megatron.core.utils import get_model_config

        check_replayable(self.model)
        config = get_model_config(self.model)
        self._owner = bool(config.sequence_parallel) or ps.get_tensor_model_parallel_rank() == 0
        self._routers = stage_routers(self.model)
        handles = [r.module.register_forward_hook(self._hook(r)) for r in self._routers]
        for r in self._routers:
            r.replay.clear_indices()
            r.replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD if self.replay else None)
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for r in self._routers:
                r.replay.clear_indices()
                r.replay.clear_router_replay_action()
            self._current = None

    @contextlib.contextmanager
    def micro(self, micro: Micro) -> Iterator[None]:
        from megatron.core.utils import get_model_config

        config = get_model_config(self.model)
        ids = micro.padded.input_ids
        positions = local_positions(ids.shape[1], ids.device, config)
        recorded = None
        if self.replay:
            recorded = _laid_out(micro, config.num_layers, config.moe_router_topk)[:, positions]
            for r in self._routers:
                r.replay.set_target_indices(_targets(recorded[:, :, r.layer]))
        self._current = _Current(micro=micro, positions=positions, recorded=recorded)
        try:
            yield
        finally:
            self._current = None

    def _hook(self, router: _Router) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            current = self._current
            if current is None:
                return  # a forward outside this pass's micro-batches
            routing_map = output[1]
            rows_count = current.micro.padded.input_ids.shape[0]
            k = int(module.topk)
            tokens = current.positions.numel() * rows_count
            if routing_map.shape[0] != tokens or bool((routing_map.sum(dim=-1) != k).any()):
                raise ValueError(
                    f"layer {router.layer + 1}'s router routed {routing_map.shape[0]} tokens "
                    f"(top-{k} each expected); this rank's share of the micro-batch is {tokens} "
                    "(positions x rows): the replay layout does not match megatron's token layout, or the "
                    "router dropped tokens (moe_expert_capacity_factor, which replay does not support)"
                )
            if not self._owner:
                return
            with torch.no_grad():
                used = (
                    _indices(routing_map, k).reshape(current.positions.numel(), rows_count, k).transpose(0, 1)
                )
                real = current.micro.indices.size
                if current.recorded is not None:
                    logits = module.gating(args[0]).reshape(-1, routing_map.shape[1]).float()
                    natural = torch.topk(logits, k, dim=-1).indices.sort(dim=-1).values
                    natural = natural.reshape(current.positions.numel(), rows_count, k).transpose(0, 1)
                    kept = (current.recorded[:, :, router.layer] >= 0).all(dim=-1)[:real]
                    differs = (natural[:real] != used[:real]).any(dim=-1)
                    self.stats.replayed += int(kept.sum())
                    self.stats.natural_differs += int((differs & kept).sum())
                if self.capture:
                    pos = current.positions.cpu().numpy()
                    values = used[:real].cpu().numpy()
                    for row, i in enumerate(current.micro.indices):
                        self._rows.setdefault(int(i), []).append((router.layer, pos, values[row]))

        return hook

    def gather(self, batch_rows: list[tuple[int, int]], num_layers: int, top_k: int) -> list[np.ndarray]:
        """Collective: every sample's routing as the routers used it, ``runtime.routing`` rows
        (``batch_rows[i]``: sample i's ``(prompt, response)`` lengths), the same on every rank."""
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self._rows, group=host_group())
        out = [np.full((p + r - 1, num_layers, top_k), -1, dtype=np.int64) for p, r in batch_rows]
        for part in gathered:
            for i, pieces in (part or {}).items():
                n = out[i].shape[0]
                for layer, pos, values in pieces:
                    keep = pos < n
                    out[i][pos[keep], layer] = values[keep]
        missing = [i for i, rows in enumerate(out) if (rows < 0).any()]
        if missing:
            raise AssertionError(f"no rank captured the routing of every row of samples {missing[:5]}")
        return out

    def total_stats(self) -> ReplayStats:
        """Collective: the stats summed over the ranks that own them."""
        gathered: list[Any] = [None] * dist.get_world_size()
        counts = (self.stats.replayed, self.stats.natural_differs)
        dist.all_gather_object(gathered, counts, group=host_group())
        return ReplayStats(replayed=sum(g[0] for g in gathered), natural_differs=sum(g[1] for g in gathered))


def _laid_out(micro: Micro, num_layers: int, top_k: int) -> torch.Tensor:
    """The micro-batch's record over its padded ``[B, S]`` input: ``[B, S, layers, top_k]``,
    -1 where nothing is recorded (padding, the last token, filler rows)."""
    ids = micro.padded.input_ids
    rows = micro.batch.routing
    if rows is None and micro.indices.size:
        raise ValueError(
            "routing replay asked for a batch without routing (TrainBatch.routing is None); record it "
            "first (rl_config.routing_replay R3: the rollout engine; R2: the trainer's log-prob pass)"
        )
    out = torch.full((*ids.shape, num_layers, top_k), -1, dtype=torch.long)
    for i, r in enumerate(rows or ()):
        t = torch.as_tensor(np.asarray(r), dtype=torch.long)
        if t.shape[1:] != (num_layers, top_k) or t.shape[0] > ids.shape[1]:
            raise ValueError(
                f"sample {int(micro.indices[i]) if i < micro.indices.size else i}: routing of shape "
                f"{tuple(t.shape)} does not fit a sequence of {ids.shape[1]} positions x "
                f"{num_layers} MoE layers x top_k {top_k} (this model's)"
            )
        out[i, : t.shape[0]] = t
    return out.to(ids.device)


def _targets(recorded: torch.Tensor) -> torch.Tensor:
    """``[B, S_local, K]`` record (-1: none) -> megatron's ``[S_local * B, K]`` targets, unrecorded
    rows routed to experts ``0..K-1`` (module docstring)."""
    k = recorded.shape[-1]
    fallback = torch.arange(k, device=recorded.device).expand_as(recorded)
    filled = torch.where((recorded >= 0).all(dim=-1, keepdim=True), recorded, fallback)
    return filled.transpose(0, 1).reshape(-1, k).contiguous()


def _indices(routing_map: torch.Tensor, k: int) -> torch.Tensor:
    """``[tokens, experts]`` boolean map with ``k`` per row -> ``[tokens, k]`` expert ids, ascending."""
    return torch.nonzero(routing_map)[:, 1].reshape(routing_map.shape[0], k)
