"""Megatron snapshots through the GU's merge: per-rank megatron shards -> HF weights, exactly.

The per-rank shards are built by the megatron backend's loader (``megatron_shard`` over
``megatron_names``, both checked against real GPTModel state_dicts by the gloo tests), exported
with ``export_shard`` and merged by the same ``apply_name_map`` / ``merge_pieces`` the convert uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.parity.models import build_parity_model
from mindspeed_rl.models.training.megatron.hf_mapping import megatron_shard
from mindspeed_rl.models.training.megatron.hf_sources import DictSource
from mindspeed_rl.models.training.megatron.param_names import export_name, export_shard, megatron_names
from mindspeed_rl.weights import megatron_rules
from mindspeed_rl.weights.megatron_dims import ShardCoords, load_dims
from mindspeed_rl.weights.merge import Piece, apply_name_map, merge_pieces


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "qwen3": build_parity_model(root / "qwen3", "qwen3"),
        "qwen2_tied": build_parity_model(root / "qwen2", "qwen2", tied=True),
        "moe": build_parity_model(root / "moe", "qwen3_moe"),
    }


def _hf(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _snapshot_pieces(path: Path, tp: int, pp: int, ep: int) -> tuple[list[Piece], int]:
    """What every rank of the layout writes, as the convert reads it back."""
    dims, source = load_dims(path), DictSource(_hf(path))
    layout = megatron_rules.training_layout(tp_size=tp, pp_size=pp, ep_size=ep)
    pieces, written = [], 0
    for p in range(pp):
        for e in range(ep):
            for t in range(tp):
                coords = ShardCoords(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, ep_rank=e, ep_size=ep)
                state = {n: megatron_shard(n, dims, coords, source) for n in megatron_names(dims, coords)}
                for name, tensor in export_shard(state, dims, coords).items():
                    spec, rank = layout.spec_for(name), megatron_rules.rank_coords(coords)
                    if layout.writes(spec, rank):
                        pieces.append(Piece(name=name, tensor=tensor, spec=spec, coords=rank))
                        written += 1
    return pieces, written


@pytest.mark.parametrize(
    ("model", "tp", "pp", "ep"),
    [
        ("qwen3", 2, 1, 1),
        ("qwen3", 2, 2, 1),
        ("qwen2_tied", 2, 2, 1),
        ("moe", 1, 1, 2),
        ("moe", 2, 1, 2),
        ("moe", 1, 2, 4),
    ],
)
def test_megatron_snapshot_merges_to_the_hf_weights(
    models: dict[str, Path], model: str, tp: int, pp: int, ep: int
) -> None:
    dims = load_dims(models[model])
    pieces, _ = _snapshot_pieces(models[model], tp, pp, ep)
    renamed = apply_name_map(pieces, megatron_rules.name_map(dims, tp_size=tp))
    full = megatron_rules.trim_vocab_padding(merge_pieces(renamed, tp_size=tp, ep_size=ep), dims)
    want = _hf(models[model])
    assert set(full) == set(want)
    for name, tensor in want.items():
        assert torch.equal(full[name], tensor), name


def test_export_names_are_global_and_tied_copies_dropped(models: dict[str, Path]) -> None:
    dims = load_dims(models["moe"])
    coords = ShardCoords(pp_rank=1, pp_size=2, ep_rank=1, ep_size=2)
    name = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
    assert export_name(name, dims, coords) == "decoder.layers.1.mlp.experts.3.linear_fc2.weight"
    tied = load_dims(models["qwen2_tied"])
    assert export_name("output_layer.weight", tied, ShardCoords(pp_rank=1, pp_size=2)) is None


def test_replicated_tensors_are_written_once_per_layout(models: dict[str, Path]) -> None:
    _, written = _snapshot_pieces(models["qwen3"], 2, 1, 1)
    _, single = _snapshot_pieces(models["qwen3"], 1, 1, 1)
    # 2 layers x (qkv, proj, fc1, fc2) + embedding + output are split: one extra copy each at TP2.
    assert written == single + 2 * 4 + 2


def test_unknown_names_and_bad_expert_tp_are_named() -> None:
    with pytest.raises(ValueError, match="has no HF name"):
        megatron_rules.hf_name("decoder.layers.0.mlp.linear_fc9.weight")
    with pytest.raises(ValueError, match="expert_tensor_parallel_size=2"):
        megatron_rules.training_layout(tp_size=4, pp_size=1, ep_size=2, expert_tensor_parallel_size=2)
