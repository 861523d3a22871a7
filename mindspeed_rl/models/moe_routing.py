"""Record and replay the MoE routing of an HF Qwen3-MoE model through hooks on its routers.

Written against transformers 5.19.0's ``Qwen3MoeTopKRouter`` (models/qwen3_moe/modeling_qwen3_moe.py):
its forward flattens the hidden states to ``[tokens, hidden]`` and returns
``(router_logits, router_scores, router_indices)``, the scores being the softmax probabilities at
the top-k (renormalised when ``norm_topk_prob``), which the experts weight their outputs with. The
sparse block calls it once per forward, layer by layer, in module order.

Capture keeps each call's indices. Replay is a forward hook that swaps the indices for the
recorded ones and recomputes the scores from this model's own probabilities at those experts, so
the gradient still reaches the router weights through the chosen experts' probabilities (what
megatron-core's router replay does for its routers). Positions recorded as -1 (padding, the last
response token, which scores nothing) keep the router's own choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers in layer order; ValueError naming the fix if it has none."""
    routers = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    if not routers:
        raise ValueError(
            f"routing replay hooks the routers of an HF Qwen3-MoE model; {type(model).__name__} has none "
            "(a dense model routes nothing: set rl_config.routing_replay: null)"
        )
    return routers


def moe_shape(model: PreTrainedModel) -> tuple[int, int, int]:
    """``(moe_layers, top_k, num_experts)`` of a Qwen3-MoE model."""
    routers = moe_routers(model)
    first: Any = routers[0]
    return len(routers), int(first.top_k), int(first.num_experts)


@dataclass(slots=True)
class ReplayStats:
    """Rows (position x layer) replayed, and how many of them the router alone would have routed to
    another expert set: the training-inference routing mismatch that replay removes."""

    replayed: int = 0
    natural_differs: int = 0

    def add(self, other: ReplayStats) -> None:
        self.replayed += other.replayed
        self.natural_differs += other.natural_differs


class RouterHooks:
    """Capture and replay over one model's routers (one instance per model)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._routers = moe_routers(model)
        first: Any = self._routers[0]
        self.top_k = int(first.top_k)
        self.num_experts = int(first.num_experts)

    @property
    def num_layers(self) -> int:
        return len(self._routers)

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[list[torch.Tensor]]]:
        """Yields ``calls[layer]``: each forward's ``[tokens, top_k]`` indices (detached, as used),
        appended as the forwards run."""
        calls: list[list[torch.Tensor]] = [[] for _ in self._routers]

        def hook_for(layer: int) -> Any:
            def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
                calls[layer].append(output[2].detach())

            return hook

        handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(self._routers)]
        try:
            yield calls
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def replay(self, routing: torch.Tensor) -> Iterator[ReplayStats]:
        """Route every forward inside the block by ``routing``: ``[batch, seq, layers, top_k]``
        int64 expert ids laid out like the forward's ``input_ids`` (-1: the router chooses)."""
        if routing.dim() != 4 or routing.shape[2:] != (self.num_layers, self.top_k):
            raise ValueError(
                f"replay routing of shape {tuple(routing.shape)}; this model needs "
                f"[batch, seq, {self.num_layers} MoE layers, top_k {self.top_k}]"
            )
        stats = ReplayStats()
        flat = routing.reshape(-1, self.num_layers, self.top_k)

        def hook_for(layer: int) -> Any:
            recorded = flat[:, layer]
            keep = (recorded >= 0).all(dim=-1)

            def hook(module: Any, args: Any, output: Any) -> Any:
                logits, _, natural = output
                if natural.shape[0] != recorded.shape[0]:
                    raise ValueError(
                        f"layer {layer}'s router saw {natural.shape[0]} tokens; the replayed routing has "
                        f"{recorded.shape[0]} (batch x seq of the forward's input_ids)"
                    )
                rec = recorded.to(natural.device)
                kept = keep.to(natural.device)
                indices = torch.where(kept.unsqueeze(-1), rec, natural)
                with torch.no_grad():
                    differs = (indices.sort(dim=-1).values != natural.sort(dim=-1).values).any(dim=-1)
                    stats.replayed += int(kept.sum())
                    stats.natural_differs += int((differs & kept).sum())
                probs = torch.softmax(logits, dim=-1, dtype=torch.float)
                scores = probs.gather(1, indices)
                if module.norm_topk_prob:
                    scores = scores / scores.sum(dim=-1, keepdim=True)
                return logits, scores.to(logits.dtype), indices

            return hook

        # prepend: the replay runs before any other hook on the router (a capture registered
        # earlier, say), so every observer sees the experts the forward actually uses.
        handles = [r.register_forward_hook(hook_for(i), prepend=True) for i, r in enumerate(self._routers)]
        try:
            yield stats
        finally:
            for h in handles:
                h.remove()


def stack_calls(calls: list[list[torch.Tensor]], call: int) -> torch.Tensor:
    """One forward's indices of every layer: ``[tokens, layers, top_k]``."""
    return torch.stack([per_layer[call] for per_layer in calls], dim=1)


def padded_routing(
    rows: tuple[Any, ...], width: int, num_layers: int, top_k: int, device: torch.device | str
) -> torch.Tensor:
    """Per-sample ``[positions, layers, top_k]`` arrays, right-padded with -1 to ``[B, width, L, K]``
    (sequences start at position 0, as ``batch.pad_batch`` lays them out)."""
    out = torch.full((len(rows), width, num_layers, top_k), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        t = torch.as_tensor(r, dtype=torch.long)
        if t.shape[1:] != (num_layers, top_k) or t.shape[0] > width:
            raise ValueError(
                f"sample {i}: routing of shape {tuple(t.shape)} does not fit a sequence of {width} positions "
                f"x {num_layers} MoE layers x top_k {top_k}"
            )
        out[i, : t.shape[0]] = t
    return out.to(device)
