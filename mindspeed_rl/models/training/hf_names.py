"""Between an HF model's in-memory parameters and its checkpoint (and vLLM's) tensor names.

Two differences under transformers 5 (in-memory names; 4.x keeps experts unfused, which passes
through unchanged), both invisible to ``save_pretrained``/``from_pretrained``
but not to anyone who moves ``state_dict`` tensors by hand (a weight refresh does):

- tied embeddings: ``state_dict`` lists ``lm_head.weight`` (the same tensor as
  ``model.embed_tokens.weight``); the checkpoint, and vLLM's weight loader, do not;
- fused MoE experts: ``mlp.experts.gate_up_proj [E, 2F, H]`` and ``mlp.experts.down_proj
  [E, H, F]`` in memory, ``mlp.experts.{e}.gate_proj|up_proj|down_proj.weight`` ([F, H], [F, H],
  [H, F]) on disk; gate rows come before up rows in the fused tensor (as transformers converts).

``to_checkpoint_format`` maps the first to the second at export; ``to_model_state`` the reverse,
for an HF engine reloading a snapshot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_GATE_UP = re.compile(r"^(?P<prefix>.+\.experts)\.gate_up_proj$")
_DOWN = re.compile(r"^(?P<prefix>.+\.experts)\.down_proj$")


def tied_targets(model: PreTrainedModel) -> dict[str, str]:
    """``{tied name: the name it shares storage with}``, e.g. ``{"lm_head.weight":
    "model.embed_tokens.weight"}``; empty for untied models. The same table ``save_pretrained``
    uses to leave the tied names out of the checkpoint (transformers 4.x and 5.x find it
    differently: ``models.transformers_compat``)."""
    from mindspeed_rl.models import transformers_compat

    return transformers_compat.tied_targets(model)


def to_checkpoint_format(
    named: Iterable[tuple[str, torch.Tensor]], *, tied: Mapping[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint-named tensors (views, no copies) of in-memory ``named`` tensors."""
    for name, tensor in named:
        if name in tied:
            continue
        gate_up = _GATE_UP.match(name) if tensor.ndim == 3 else None
        down = _DOWN.match(name) if tensor.ndim == 3 else None
        if gate_up is not None:
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{gate_up['prefix']}.{e}.gate_proj.weight", tensor[e, :half]
                yield f"{gate_up['prefix']}.{e}.up_proj.weight", tensor[e, half:]
        elif down is not None:
            for e in range(tensor.shape[0]):
                yield f"{down['prefix']}.{e}.down_proj.weight", tensor[e]
        else:
            yield name, tensor


def checkpoint_names(model: PreTrainedModel) -> frozenset[str]:
    """The names a complete weight update for ``model`` carries, in checkpoint format."""
    state = model.state_dict()
    return frozenset(name for name, _ in to_checkpoint_format(state.items(), tied=tied_targets(model)))


def to_model_state(tensors: Mapping[str, torch.Tensor], model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A full ``state_dict`` for ``model`` from checkpoint-named ``tensors`` (fused, ties filled).

    Raises a ValueError naming the missing checkpoint tensors; extra ones are passed through for
    ``load_state_dict(strict=True)`` to reject.
    """
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    tied = tied_targets(model)
    for name, current in model.state_dict().items():
        if name in tied:
            continue
        parts = _checkpoint_parts(name, current)
        missing = [p for p in parts if p not in tensors]
        if missing:
            raise ValueError(
                f"weight update lacks {missing[:3]} ({len(missing)} missing) for {name}; send every "
                "tensor of the checkpoint (save_pretrained's names)"
            )
        used.update(parts)
        state[name] = _fuse(name, current, [tensors[p] for p in parts])
    for target, source in tied.items():
        state[target] = state[source]
    state.update({k: v for k, v in tensors.items() if k not in used})
    return state


def _checkpoint_parts(name: str, current: torch.Tensor) -> list[str]:
    return [n for n, _ in to_checkpoint_format([(name, current)], tied={})]


def _fuse(name: str, current: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    if current.ndim == 3 and _GATE_UP.match(name):
        # parts alternate gate_e, up_e (the order to_checkpoint_format yields them in).
        return torch.stack([torch.cat(parts[i : i + 2], dim=0) for i in range(0, len(parts), 2)])
    if current.ndim == 3 and _DOWN.match(name):
        return torch.stack(parts)
    return parts[0]
