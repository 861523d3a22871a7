"""Uneven pipeline stages in megatron-core itself: each stage builds ``stage_layers[pp_rank]``
layers, numbered from ``sum(stage_layers[:pp_rank])`` (the layer numbers megatron uses for its
sharded checkpoints and MoE bookkeeping).

megatron-core 0.19.2 says so in its own terms: ``TransformerConfig.pipeline_model_parallel_layout``
(``transformer/pipeline_parallel_layer_layout.py``: one list of layer types per stage, the
embedding first, the loss last). megatron-core 0.12.1, MindSpeed's, has no layout, and its
``num_layers_in_first/last_pipeline_stage`` cannot give a list whose middle stages differ
(16,17,16,15); there the two functions every stage asks, ``get_num_layers_to_build`` and
``get_transformer_layer_offset`` (transformer_block.py and transformer_layer.py, which each hold
their own reference), are wrapped to answer from the stage list a config carries, as MindSpeed's
``num_layer_list`` feature wraps them on NPU. A config without the list gets the wrapped function's
own answer, so the wrap changes nothing for even splits (or for MindSpeed's patches beneath it).
Which one applies is read from the installed TransformerConfig's fields, not from its version.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

STAGES_ATTR = "_mindspeed_rl_stage_layers"
_WRAPPED = "_mindspeed_rl_stage_wrapped"


def has_layout_field(config_cls: type) -> bool:
    """Whether this megatron-core's TransformerConfig takes ``pipeline_model_parallel_layout``."""
    return "pipeline_model_parallel_layout" in {f.name for f in dataclasses.fields(config_cls)}


def layout_list(stages: Sequence[int]) -> list[list[str]]:
    """megatron-core 0.19.2's layout of these stages: embedding + decoders | decoders | ... + loss."""
    out = [["decoder"] * count for count in stages]
    out[0].insert(0, "embedding")
    out[-1].append("loss")
    return out


def config_kwargs(config_cls: type, stages: Sequence[int]) -> dict[str, Any]:
    """TransformerConfig keywords for ``stages`` (empty where the stages are wrapped in instead)."""
    if not stages or not has_layout_field(config_cls):
        return {}
    return {"pipeline_model_parallel_layout": layout_list(stages)}


def attach(config: Any, stages: Sequence[int]) -> None:
    """On a megatron-core without layouts: give ``config`` its stages and wrap the functions that
    read them (once per process)."""
    if not stages or has_layout_field(type(config)):
        return
    setattr(config, STAGES_ATTR, tuple(stages))
    _wrap_stage_functions()


def _stages_of(config: Any) -> tuple[int, ...] | None:
    return getattr(config, STAGES_ATTR, None)


def _pp_rank() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_rank()


def _num_layers(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def wrapper(config: Any, *args: Any, **kwargs: Any) -> int:
        stages = _stages_of(config)
        return fn(config, *args, **kwargs) if stages is None else stages[_pp_rank()]

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _offset(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def wrapper(config: Any, *args: Any, **kwargs: Any) -> int:
        stages = _stages_of(config)
        return fn(config, *args, **kwargs) if stages is None else sum(stages[: _pp_rank()])

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _wrap_stage_functions() -> None:
    from megatron.core.transformer import transformer_block, transformer_layer

    for module, name, wrap in (
        (transformer_block, "get_num_layers_to_build", _num_layers),
        (transformer_block, "get_transformer_layer_offset", _offset),
        (transformer_layer, "get_transformer_layer_offset", _offset),
    ):
        fn = getattr(module, name)
        if not getattr(fn, _WRAPPED, False):
            setattr(module, name, wrap(fn))
