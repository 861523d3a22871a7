from __future__ import annotations

import pytest
import torch

from mindspeed_rl.weights.convert import GuConverter, convert_snapshot
from mindspeed_rl.weights.export import SnapshotWriter
from mindspeed_rl.weights.layout import (
    InferenceLayout,
    PartitionRule,
    PartitionSpec,
    RankCoords,
    TrainingLayout,
    hf_dense_rules,
)
from mindspeed_rl.weights.manifest import SnapshotError, SnapshotInfo
from mindspeed_rl.weights.merge import (
    NameMap,
    Piece,
    apply_name_map,
    megatron_unfuse_rules,
    merge_pieces,
)
from mindspeed_rl.weights.reload import ReloadPolicy
from mindspeed_rl.weights.store import latest_published

TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())


def _tp_slice(layout: TrainingLayout, full: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """What a training rank holds: its TP chunk of split tensors, a full copy of replicated ones."""
    coords = layout.coords(rank)
    out = {}
    for name, tensor in full.items():
        spec = layout.spec_for(name)
        t = tensor
        if spec.ep_dim is not None:
            t = t.chunk(layout.ep_size, dim=spec.ep_dim)[coords.ep_rank]
        if spec.tp_dim is not None:
            t = t.chunk(layout.tp_size, dim=spec.tp_dim)[coords.tp_rank]
        out[name] = t
    return out


def _export_all_ranks(root, layout, per_rank, version=1) -> SnapshotInfo:
    writer = SnapshotWriter(root)
    for rank, tensors in enumerate(per_rank):
        writer.export(version, tensors.items(), layout, rank=rank)
    writer.close()
    info = latest_published(root)
    assert info is not None and info.version == version
    return info


def test_tp2_column_and_row_parallel_merge_to_the_original(tmp_path, tiny_model):
    shards = [_tp_slice(TP2, tiny_model, r) for r in range(2)]
    assert shards[0]["model.layers.0.self_attn.o_proj.weight"].shape == (8, 4)  # row parallel: dim 1
    assert shards[1]["model.layers.0.mlp.gate_proj.weight"].shape == (6, 8)  # column parallel: dim 0
    info = _export_all_ranks(tmp_path, TP2, shards)

    weights = convert_snapshot(info, InferenceLayout())
    assert len(weights.per_rank) == 1
    assert sorted(weights.per_rank[0]) == sorted(tiny_model)
    for name, tensor in tiny_model.items():
        assert torch.equal(weights.per_rank[0][name], tensor), name


def test_split_for_inference_tp2_gives_expected_slices(tmp_path, tiny_model):
    info = _export_all_ranks(tmp_path / "export", TP2, [_tp_slice(TP2, tiny_model, r) for r in range(2)])
    layout = InferenceLayout(tp_size=2, rules=hf_dense_rules())
    converter = GuConverter(tmp_path / "gu", layout)
    converted = converter.convert(info).converted

    for rank in range(2):
        engine: dict[str, torch.Tensor] = {}
        result = ReloadPolicy(0, rank=rank).maybe_reload(converted, engine.update)
        assert result.status == "loaded"
        q = tiny_model["model.layers.0.self_attn.q_proj.weight"]
        o = tiny_model["model.layers.0.self_attn.o_proj.weight"]
        assert torch.equal(engine["model.layers.0.self_attn.q_proj.weight"], q[4 * rank : 4 * (rank + 1)])
        assert torch.equal(engine["model.layers.0.self_attn.o_proj.weight"], o[:, 4 * rank : 4 * (rank + 1)])
        assert torch.equal(engine["model.norm.weight"], tiny_model["model.norm.weight"])


def _moe_model() -> tuple[TrainingLayout, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    stacked = PartitionRule(pattern=r"grouped_experts\.fc1$", spec=PartitionSpec(ep_dim=0, tp_dim=1))
    layout = TrainingLayout(tp_size=2, ep_size=2, rules=(stacked, *hf_dense_rules()))
    full = {
        f"model.layers.0.mlp.experts.{e}.gate_proj.weight": torch.randn(4, 6, generator=gen) for e in range(4)
    }
    full |= {
        f"model.layers.0.mlp.experts.{e}.down_proj.weight": torch.randn(6, 4, generator=gen) for e in range(4)
    }
    full["model.layers.0.mlp.grouped_experts.fc1"] = torch.randn(
        4, 8, 6, generator=gen
    )  # [expert, ffn, hidden]
    full["model.layers.0.mlp.gate.weight"] = torch.randn(4, 6, generator=gen)  # router: replicated
    return layout, full


def _ep_tp_rank_tensors(
    layout: TrainingLayout, full: dict[str, torch.Tensor], rank: int
) -> dict[str, torch.Tensor]:
    """Per-expert names live on their EP rank only (experts 0-1 on EP 0, 2-3 on EP 1)."""
    coords = layout.coords(rank)
    mine = {}
    for name, tensor in _tp_slice(layout, full, rank).items():
        if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) // 2 != coords.ep_rank:
            continue
        mine[name] = tensor
    return mine


def test_ep2_tp2_expert_slices_merge_and_resplit(tmp_path):
    layout, full = _moe_model()
    info = _export_all_ranks(tmp_path, layout, [_ep_tp_rank_tensors(layout, full, r) for r in range(4)])
    merged = convert_snapshot(info, InferenceLayout()).per_rank[0]
    assert sorted(merged) == sorted(full)
    for name, tensor in full.items():
        assert torch.equal(merged[name], tensor), name

    inference = InferenceLayout(ep_size=2, rules=layout.rules)
    per_rank = convert_snapshot(info, inference).per_rank
    assert sorted(k for k in per_rank[1] if ".experts." in k) == sorted(
        f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for e in (2, 3) for p in ("gate", "down")
    )
    assert torch.equal(
        per_rank[1]["model.layers.0.mlp.grouped_experts.fc1"],
        full["model.layers.0.mlp.grouped_experts.fc1"][2:],
    )


def test_missing_tp_rank_is_an_error():
    spec = PartitionSpec(tp_dim=0)
    pieces = [Piece(name="w", tensor=torch.zeros(2, 2), spec=spec, coords=RankCoords(tp_rank=0))]
    with pytest.raises(SnapshotError, match="expected 0..1"):
        merge_pieces(pieces, tp_size=2, ep_size=1)
    twice = [
        Piece(name="n", tensor=torch.zeros(2), spec=PartitionSpec(), coords=RankCoords(tp_rank=r))
        for r in (0, 1)
    ]
    with pytest.raises(SnapshotError, match="replicated over TP"):
        merge_pieces(twice, tp_size=2, ep_size=1)


def test_megatron_fused_qkv_and_gate_up_unfuse_per_tp_piece():
    groups, heads_per_group, head_dim, hidden, ffn, tp = 2, 2, 3, 5, 4, 2
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(groups * heads_per_group * head_dim, hidden, generator=gen)
    k = torch.randn(groups * head_dim, hidden, generator=gen)
    v = torch.randn(groups * head_dim, hidden, generator=gen)
    gate, up = torch.randn(ffn, hidden, generator=gen), torch.randn(ffn, hidden, generator=gen)
    spec = PartitionSpec(tp_dim=0)
    pieces = []
    for rank in range(tp):
        # Megatron layout on one TP rank: its query groups, each [q_g; k_g; v_g]; fc1 = [gate_r; up_r].
        rank_groups = range(rank * groups // tp, (rank + 1) * groups // tp)
        qkv = torch.cat(
            [
                torch.cat(
                    [
                        q.view(groups, -1, hidden)[g],
                        k.view(groups, -1, hidden)[g],
                        v.view(groups, -1, hidden)[g],
                    ]
                )
                for g in rank_groups
            ]
        )
        fc1 = torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
        coords = RankCoords(tp_rank=rank)
        pieces.append(
            Piece(
                name="decoder.layers.0.self_attention.linear_qkv.weight", tensor=qkv, spec=spec, coords=coords
            )
        )
        pieces.append(
            Piece(name="decoder.layers.0.mlp.linear_fc1.weight", tensor=fc1, spec=spec, coords=coords)
        )
    rules = megatron_unfuse_rules(
        num_query_groups=groups,
        heads_per_group=heads_per_group,
        head_dim=head_dim,
        ffn_hidden_size=ffn,
        tp_size=tp,
    )
    # The rename hook: a Megatron -> HF table (a real one would use a regex per layer).
    hf_name = {
        "decoder.layers.0.self_attention.linear_q.weight": "model.layers.0.self_attn.q_proj.weight",
        "decoder.layers.0.self_attention.linear_k.weight": "model.layers.0.self_attn.k_proj.weight",
        "decoder.layers.0.self_attention.linear_v.weight": "model.layers.0.self_attn.v_proj.weight",
        "decoder.layers.0.mlp.linear_gate.weight": "model.layers.0.mlp.gate_proj.weight",
        "decoder.layers.0.mlp.linear_up.weight": "model.layers.0.mlp.up_proj.weight",
    }

    def rename(name: str) -> str:
        return hf_name[name]

    merged = merge_pieces(apply_name_map(pieces, NameMap(rename=rename, unfuse=rules)), tp_size=tp, ep_size=1)
    expected = {
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.mlp.up_proj.weight": up,
    }
    assert sorted(merged) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(merged[name], tensor), name


def test_layout_errors_name_the_fix():
    with pytest.raises(ValueError, match="named group 'expert'"):
        PartitionRule(pattern=r"experts\.\d+", spec=PartitionSpec(ep_local=True))
    with pytest.raises(ValueError, match="contradictory"):
        PartitionSpec(ep_dim=0, ep_local=True)
    with pytest.raises(ValueError, match="tp_size=0"):
        TrainingLayout(tp_size=0)
    with pytest.raises(ValueError, match="divisible by tp_size"):
        megatron_unfuse_rules(num_query_groups=3, heads_per_group=1, head_dim=2, ffn_hidden_size=4, tp_size=2)
