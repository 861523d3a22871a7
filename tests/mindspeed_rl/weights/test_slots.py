"""A weight that does not fit the engine's slot is an error naming the tensor, both shapes and the
config keys behind each dim, raised before any engine sees it."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from mindspeed_rl.models.tiny import TINY_QWEN3_MOE_ARCH, create_tiny_model
from mindspeed_rl.weights.slots import EngineSlots, WeightShapeError

# The reported checkpoint: hidden 64, expert width 48, 6 experts top-2, head_dim 32 (4 heads).
REPORTED = {**TINY_QWEN3_MOE_ARCH, "num_experts": 6, "moe_ffn_hidden_size": 48}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("moe48") / "model", REPORTED)


def test_slots_are_the_start_folder_shapes(reported: Path) -> None:
    slots = EngineSlots.from_model_dir(reported)
    tensors = load_file(str(reported / "model.safetensors"))
    assert slots.shapes == {name: tuple(t.shape) for name, t in tensors.items()}
    slots.check((name, t.shape) for name, t in tensors.items())  # the start weights fit


def test_an_expert_of_another_width_names_the_tensor_shapes_and_config_keys(
    reported: Path, tmp_path: Path
) -> None:
    other = create_tiny_model(tmp_path / "moe64", {**REPORTED, "moe_ffn_hidden_size": 64})
    weights = load_file(str(other / "model.safetensors"))
    with pytest.raises(WeightShapeError) as caught:
        EngineSlots.from_model_dir(reported).check((n, t.shape) for n, t in weights.items())
    message = str(caught.value)
    # 6 experts x (gate, up, down) x 2 layers misfit; the first ones are listed, the rest counted.
    assert message.startswith("36 weights do not fit the engine started from")
    assert (
        "model.layers.0.mlp.experts.0.down_proj.weight: the weight is [64, 64], the engine's slot [64, 48]"
        in message
    )
    assert "dim 0 = hidden_size (64), dim 1 = moe_intermediate_size (48)" in message
    assert str(reported / "config.json") in message and "and 31 more" in message


def test_attention_dims_name_heads_times_head_dim(reported: Path) -> None:
    slots = EngineSlots.from_model_dir(reported)
    with pytest.raises(WeightShapeError, match=r"num_attention_heads x head_dim \(4 x 32 = 128\)"):
        slots.check([("model.layers.1.self_attn.q_proj.weight", (64, 64))])
    with pytest.raises(WeightShapeError, match=r"num_key_value_heads x head_dim \(2 x 32 = 64\)"):
        slots.check([("model.layers.1.self_attn.k_proj.weight", (128, 64))])


def test_names_without_a_slot_are_left_to_the_engine(reported: Path) -> None:
    EngineSlots.from_model_dir(reported).check([("model.layers.9.mlp.gate.weight", (1, 2))])
