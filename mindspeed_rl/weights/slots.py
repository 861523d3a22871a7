"""Does a weight fit the engine it is about to be loaded into? Checked before the engine is touched.

An engine is built from a model folder's ``config.json`` and first loads that folder's tensors,
so their shapes are the slots every later update must fill. A weight of another shape is a
configuration error (a snapshot of another model, a converter rule that splits the wrong dim),
and inside an engine it surfaces as an anonymous size mismatch deep in a loader (vLLM:
``The size of tensor a (128) must match the size of tensor b (96)``), naming no tensor. Here it
is a `WeightShapeError` naming the tensor, both shapes and the config keys each dim comes from::

    model.layers.0.mlp.experts.3.gate_proj.weight: the weight is [64, 64], the engine's slot
    [48, 64] (dim 0 = moe_intermediate_size (48), dim 1 = hidden_size (64) in /models/q/config.json)

Shapes are read from the safetensors headers only (no tensor bytes) and the config-key table
covers the HF Qwen / Llama / Qwen-MoE names; other names are reported with their shapes alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindspeed_rl.weights.shardio import read_header

_MAX_LISTED = 5
_HEADS = ("num_attention_heads", "head_dim")
_KV_HEADS = ("num_key_value_heads", "head_dim")
# (pattern searched in the HF name, config keys behind each dim: a tuple multiplies its keys)
_DIMS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    (r"(embed_tokens|lm_head)\.weight$", (("vocab_size",), ("hidden_size",))),
    (r"self_attn\.q_proj\.weight$", (_HEADS, ("hidden_size",))),
    (r"self_attn\.q_proj\.bias$", (_HEADS,)),
    (r"self_attn\.(k|v)_proj\.weight$", (_KV_HEADS, ("hidden_size",))),
    (r"self_attn\.(k|v)_proj\.bias$", (_KV_HEADS,)),
    (r"self_attn\.o_proj\.weight$", (("hidden_size",), _HEADS)),
    (r"self_attn\.(q|k)_norm\.weight$", (("head_dim",),)),
    (r"mlp\.experts\.\d+\.(gate|up)_proj\.weight$", (("moe_intermediate_size",), ("hidden_size",))),
    (r"mlp\.experts\.\d+\.down_proj\.weight$", (("hidden_size",), ("moe_intermediate_size",))),
    (
        r"mlp\.shared_expert\.(gate|up)_proj\.weight$",
        (("shared_expert_intermediate_size",), ("hidden_size",)),
    ),
    (r"mlp\.shared_expert\.down_proj\.weight$", (("hidden_size",), ("shared_expert_intermediate_size",))),
    (r"mlp\.shared_expert_gate\.weight$", ((), ("hidden_size",))),
    (r"mlp\.gate\.weight$", (("num_experts",), ("hidden_size",))),
    (r"mlp\.(gate|up)_proj\.weight$", (("intermediate_size",), ("hidden_size",))),
    (r"mlp\.down_proj\.weight$", (("hidden_size",), ("intermediate_size",))),
    (r"norm\.weight$", (("hidden_size",),)),
)


class WeightShapeError(ValueError):
    """A weight does not fit the engine's slot for it: the update was not loaded."""


@dataclass(frozen=True, slots=True)
class EngineSlots:
    """The tensor shapes an engine started from ``source`` holds, and that folder's config."""

    shapes: Mapping[str, tuple[int, ...]]
    config: Mapping[str, Any]
    source: str

    @classmethod
    def from_model_dir(cls, path: str | Path) -> EngineSlots:
        """Shapes from every ``*.safetensors`` header of the folder (no tensor bytes), and its config.json."""
        folder = Path(path)
        config_path = folder / "config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        return cls(shapes=folder_shapes(folder), config=config, source=str(config_path))

    def check(self, shapes: Iterable[tuple[str, Sequence[int]]]) -> None:
        """Raise WeightShapeError for every named shape that differs from its slot.

        Names the engine has no slot for are left to the engine's own name check.
        """
        misfits = [
            (name, tuple(shape), self.shapes[name])
            for name, shape in shapes
            if name in self.shapes and tuple(shape) != self.shapes[name]
        ]
        if not misfits:
            return
        lines = [
            f"{name}: the weight is {list(got)}, the engine's slot {list(want)} ({self.explain(name)})"
            for name, got, want in misfits[:_MAX_LISTED]
        ]
        more = f"; and {len(misfits) - _MAX_LISTED} more" if len(misfits) > _MAX_LISTED else ""
        raise WeightShapeError(
            f"{len(misfits)} weights do not fit the engine started from {Path(self.source).parent}: "
            + "; ".join(lines)
            + more
            + ". The weights come from a model of another shape: convert snapshots of the model the "
            "engine serves, or start the engine from a folder whose config.json matches them"
        )

    def explain(self, name: str) -> str:
        """Which config keys (and their values) each dim of ``name`` comes from."""
        for pattern, dims in _DIMS:
            if re.search(pattern, name):
                parts = [f"dim {i} = {self._describe(keys)}" for i, keys in enumerate(dims) if keys]
                return f"{', '.join(parts)} in {self.source}"
        return f"no config key is known for this tensor; see {self.source}"

    def _describe(self, keys: tuple[str, ...]) -> str:
        values = [_config_value(self.config, key) for key in keys]
        label = " x ".join(keys)
        if any(v is None for v in values):
            return f"{label} (not in the config)"
        product = 1
        for v in values:
            product *= int(v)  # type: ignore[arg-type]
        return f"{label} ({' x '.join(str(v) for v in values)}{f' = {product}' if len(values) > 1 else ''})"


def _config_value(config: Mapping[str, Any], key: str) -> int | None:
    """A config key as the engines read it, including the defaults HF configs leave implicit."""
    value = config.get(key)
    if (
        value is None
        and key == "head_dim"
        and config.get("hidden_size")
        and config.get("num_attention_heads")
    ):
        value = int(config["hidden_size"]) // int(config["num_attention_heads"])
    if value is None and key == "num_key_value_heads":
        value = config.get("num_attention_heads")
    if value is None and key == "num_experts":
        value = config.get("num_local_experts")
    return None if value is None else int(value)


def folder_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the folder's safetensors files, from their headers alone."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}; pass a folder saved by save_pretrained")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        header, _ = read_header(file, file.stat().st_size)
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in info["shape"])
    return shapes
