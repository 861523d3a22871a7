"""Which transformer layers each pipeline stage holds: upstream's ``num_layer_list`` (uneven
stages) and ``noop_layers`` (identity layers padding the model for the split), resolved into the
real, weight-holding layers per stage. Torch-free: the plan and the engine both read it.

MindSpeed builds a noop layer as a layer that returns its input. That is the same function as no
layer at all, so the engine does not build them: a stage's noop layers only lower its count of
real layers, the weights of real layer ``i`` are HF layer ``i`` (noops hold none and never appear
in an export), and every stage holds ``stage_layers[p]`` real layers from
``sum(stage_layers[:p])`` on. Upstream's Qwen3-235B recipe, ``num_layers: 96`` with
``noop_layers: 5,95`` at PP16: stages of 6 positions, the first and the last with one noop, so
real layers ``(5, 6, ..., 6, 5)``, 94 in all, HF's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def parse_indices(value: Any, key: str) -> tuple[int, ...]:
    """``5,95`` / ``16,17,16,15`` (YAML string), one int, or a list, as a tuple of ints."""
    if value is None:
        return ()
    if isinstance(value, bool):
        raise ValueError(f"{key}: expected comma-separated integers, got {value!r}")
    if isinstance(value, int):
        return (value,)
    parts: Sequence[Any] = value.strip("[] ").split(",") if isinstance(value, str) else value
    try:
        return tuple(int(str(p).strip()) for p in parts if str(p).strip())
    except ValueError:
        raise ValueError(f"{key}: expected comma-separated integers, got {value!r}") from None


def stage_layers(
    *, num_layers: int, pipeline_parallel_size: int, num_layer_list: Any = None, noop_layers: Any = None
) -> tuple[int, ...]:
    """Real layers per stage, or ``()`` for megatron's own even split (no list, no noops).

    ``num_layers`` counts the noop layers (upstream's meaning); ``num_layer_list`` gives the layer
    positions per stage (noops included, summing to ``num_layers``), else the positions split
    evenly. ValueError names the key and the fix."""
    pp = pipeline_parallel_size
    positions = parse_indices(num_layer_list, "actor_config.num_layer_list")
    noops = parse_indices(noop_layers, "actor_config.noop_layers")
    if not positions and not noops:
        return ()
    if positions:
        if len(positions) != pp or sum(positions) != num_layers or min(positions) < 1:
            raise ValueError(
                f"actor_config.num_layer_list {','.join(map(str, positions))} must list one count >= 1 per "
                f"pipeline stage (pipeline_model_parallel_size {pp}) summing to num_layers {num_layers}"
            )
    else:
        if num_layers % pp:
            raise ValueError(
                f"actor_config.noop_layers: num_layers {num_layers} (noop layers included) does not split "
                f"over pipeline_model_parallel_size {pp}; add noop layers until it does, or give "
                "num_layer_list"
            )
        positions = (num_layers // pp,) * pp
    bad = [i for i in noops if not 0 <= i < num_layers]
    if bad or len(set(noops)) != len(noops):
        raise ValueError(
            f"actor_config.noop_layers {','.join(map(str, noops))}: each must be a distinct layer index "
            f"in 0..{num_layers - 1} (num_layers counts the noop layers)"
        )
    real, start = [], 0
    for count in positions:
        real.append(count - sum(start <= i < start + count for i in noops))
        start += count
    if min(real) < 1:
        raise ValueError(
            f"actor_config.noop_layers leave pipeline stage {real.index(min(real))} without a real layer "
            f"(real layers per stage {real}); move the noop layers or change num_layer_list"
        )
    return tuple(real)


def real_num_layers(num_layers: int, noop_layers: Any) -> int:
    """The model's own layer count: ``num_layers`` without the noop layers."""
    return num_layers - len(parse_indices(noop_layers, "actor_config.noop_layers"))


def stage_offset(stages: Sequence[int], pp_rank: int) -> int:
    """First real layer of stage ``pp_rank``."""
    return sum(stages[:pp_rank])


def is_even(stages: Sequence[int]) -> bool:
    return not stages or len(set(stages)) == 1
