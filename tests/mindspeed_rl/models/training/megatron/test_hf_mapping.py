"""HF <-> megatron mapping without megatron: layouts of single tensors and full round trips.

The names used here come from ``megatron_names``, which the gloo tests check against the real
``GPTModel.state_dict()`` of every layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.parity.models import build_parity_model
from mindspeed_rl.models.training.megatron.hf_mapping import assemble_hf, hf_pieces, megatron_shard
from mindspeed_rl.models.training.megatron.hf_sources import DictSource, SafetensorsSource
from mindspeed_rl.models.training.megatron.layout import SpecKind
from mindspeed_rl.models.training.megatron.param_names import export_name, megatron_names
from mindspeed_rl.weights.megatron_dims import ShardCoords, dims_from_hf_config, load_dims


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "qwen3": build_parity_model(root / "qwen3", "qwen3"),
        "qwen2_tied": build_parity_model(root / "qwen2", "qwen2", tied=True),
        "moe": build_parity_model(root / "moe", "qwen3_moe"),
    }


def _hf_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _all_coords(tp: int = 1, pp: int = 1, ep: int = 1) -> list[ShardCoords]:
    return [
        ShardCoords(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, ep_rank=e, ep_size=ep)
        for p in range(pp)
        for e in range(ep)
        for t in range(tp)
    ]


@pytest.mark.parametrize(
    ("model", "layout"),
    [
        ("qwen3", {"tp": 2}),
        ("qwen3", {"pp": 2}),
        ("qwen3", {"tp": 2, "pp": 2}),
        ("qwen2_tied", {"tp": 2}),
        ("qwen2_tied", {"pp": 2}),
        ("moe", {"ep": 2}),
        ("moe", {"tp": 2, "ep": 2}),
        ("moe", {"ep": 4}),
    ],
)
@pytest.mark.parametrize("spec", ["local", "transformer_engine"])
def test_round_trip_is_exact(
    models: dict[str, Path], model: str, layout: dict[str, int], spec: SpecKind
) -> None:
    dims = load_dims(models[model])
    state = _hf_state(models[model])
    source = DictSource(state)
    pieces = []
    for coords in _all_coords(**layout):
        coords.check(dims)
        for name in megatron_names(dims, coords, spec=spec):
            pieces += hf_pieces(name, megatron_shard(name, dims, coords, source), dims, coords)
    rebuilt = assemble_hf(pieces, dims)
    assert set(rebuilt) == set(state)
    for name, tensor in state.items():
        assert torch.equal(rebuilt[name], tensor), name


def test_fused_qkv_is_laid_out_per_query_group(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen2_tied"])  # 4 heads, 2 groups, head_dim 32, QKV bias
    state = _hf_state(models["qwen2_tied"])
    coords = ShardCoords(tp_rank=1, tp_size=2)
    qkv = megatron_shard("decoder.layers.0.self_attention.linear_qkv.weight", dims, coords, DictSource(state))
    bias = megatron_shard("decoder.layers.0.self_attention.linear_qkv.bias", dims, coords, DictSource(state))
    hd = 32
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    # TP rank 1 holds query group 1 only: [q heads 2,3 ; k head 1 ; v head 1].
    want = torch.cat([q[2 * hd : 4 * hd], k[hd : 2 * hd], v[hd : 2 * hd]])
    assert torch.equal(qkv, want)
    assert torch.equal(bias[: 2 * hd], state["model.layers.0.self_attn.q_proj.bias"][2 * hd :])


def test_fc1_is_gate_then_up_per_tp_rank(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen3"])  # ffn 96 -> 48 per TP rank
    state = _hf_state(models["qwen3"])
    fc1 = megatron_shard(
        "decoder.layers.1.mlp.linear_fc1.weight", dims, ShardCoords(tp_rank=1, tp_size=2), DictSource(state)
    )
    gate, up = state["model.layers.1.mlp.gate_proj.weight"], state["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate[48:], up[48:]]))


def test_vocab_is_padded_with_zero_rows_and_trimmed_back(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen3"])  # vocab 100 -> 256 at TP2 (128 x 2)
    assert dims.padded_vocab_size(2) == 256
    state = _hf_state(models["qwen3"])
    rank0 = megatron_shard("output_layer.weight", dims, ShardCoords(tp_rank=0, tp_size=2), DictSource(state))
    rank1 = megatron_shard("output_layer.weight", dims, ShardCoords(tp_rank=1, tp_size=2), DictSource(state))
    assert rank0.shape == rank1.shape == (128, 64)
    assert torch.equal(rank0[:100], state["lm_head.weight"]) and not rank0[100:].any() and not rank1.any()


def test_tied_output_layer_reads_the_embedding_and_is_not_exported(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen2_tied"])
    state = _hf_state(models["qwen2_tied"])
    assert "lm_head.weight" not in state
    last = ShardCoords(pp_rank=1, pp_size=2)
    assert "output_layer.weight" in megatron_names(dims, last)
    assert "output_layer.weight" not in megatron_names(dims, ShardCoords())
    out = megatron_shard("output_layer.weight", dims, last, DictSource(state))
    assert torch.equal(out[:100], state["model.embed_tokens.weight"])
    assert hf_pieces("output_layer.weight", out, dims, last) == []


def test_experts_map_local_ids_to_global_ids(models: dict[str, Path]) -> None:
    dims = load_dims(models["moe"])  # 4 experts; EP2 -> 2 local experts per rank
    state = _hf_state(models["moe"])
    coords = ShardCoords(ep_rank=1, ep_size=2, pp_rank=1, pp_size=2)
    fc2 = megatron_shard(
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", dims, coords, DictSource(state)
    )
    # PP stage 1 holds global layer 1; EP rank 1's local expert 1 is global expert 3.
    assert torch.equal(fc2, state["model.layers.1.mlp.experts.3.down_proj.weight"])
    names = megatron_names(dims, coords)
    assert "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight" not in names


def test_grouped_experts_hold_the_sequential_tensors_under_one_snapshot_name(models: dict[str, Path]) -> None:
    dims = load_dims(models["moe"])
    state = DictSource(_hf_state(models["moe"]))
    coords = ShardCoords(ep_rank=1, ep_size=2, etp_rank=1, etp_size=2)
    for fc in ("linear_fc1", "linear_fc2"):
        sequential = f"decoder.layers.1.mlp.experts.local_experts.1.{fc}.weight"
        grouped = f"decoder.layers.1.mlp.experts.{fc}.weight1"  # TEGroupedMLP: weight<local id>
        assert torch.equal(
            megatron_shard(grouped, dims, coords, state), megatron_shard(sequential, dims, coords, state)
        )
        want = f"decoder.layers.1.mlp.experts.3.{fc}.weight"  # EP rank 1, local 1 -> global 3
        assert export_name(grouped, dims, coords) == export_name(sequential, dims, coords) == want


def test_te_spec_names_fuse_the_dense_norms_into_the_next_linear(models: dict[str, Path]) -> None:
    dense, moe = load_dims(models["qwen3"]), load_dims(models["moe"])
    local, te = (set(megatron_names(dense, ShardCoords(), spec=s)) for s in ("local", "transformer_engine"))
    assert local - te == {
        f"decoder.layers.{i}.{n}"
        for i in (0, 1)
        for n in ("input_layernorm.weight", "pre_mlp_layernorm.weight")
    }
    assert te - local == {
        f"decoder.layers.{i}.{n}"
        for i in (0, 1)
        for n in ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight")
    }
    # MoE layers keep pre_mlp_layernorm (the router reads it); experts are grouped.
    te_moe = megatron_names(moe, ShardCoords(), spec="transformer_engine")
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in te_moe
    assert "decoder.layers.0.mlp.experts.linear_fc1.weight3" in te_moe
    assert not [n for n in te_moe if "local_experts" in n]


def test_safetensors_source_reads_only_the_requested_slice(models: dict[str, Path]) -> None:
    state = _hf_state(models["qwen3"])
    source = SafetensorsSource(models["qwen3"])
    name = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(source.read(name, dim=1, start=32, stop=96), state[name][:, 32:96])
    assert torch.equal(source.read(name), state[name])
    with pytest.raises(KeyError, match="not in the HF weights"):
        source.read("model.nothing.weight")


def test_dims_of_each_family(models: dict[str, Path]) -> None:
    qwen2, qwen3, moe = (load_dims(models[k]) for k in ("qwen2_tied", "qwen3", "moe"))
    assert (qwen2.qkv_bias, qwen2.qk_layernorm, qwen2.tied_embeddings) == (True, False, True)
    assert (qwen3.qkv_bias, qwen3.qk_layernorm, qwen3.heads_per_group, qwen3.head_dim) == (False, True, 2, 32)
    assert (moe.num_experts, moe.moe_topk, moe.moe_ffn_hidden_size, moe.norm_topk_prob) == (4, 2, 32, True)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model_type": "llama"}, "has no HF<->megatron mapping"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "rope type 'yarn'"),
    ],
)
def test_unsupported_configs_are_named(patch: dict[str, object], message: str) -> None:
    config = {
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        **patch,
    }
    with pytest.raises(ValueError, match=message):
        dims_from_hf_config(config)


def test_moe_with_dense_layers_is_refused() -> None:
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "mlp_only_layers": [0],
    }
    with pytest.raises(ValueError, match="every layer must be a MoE layer"):
        dims_from_hf_config(config)


def test_layout_that_does_not_divide_the_model_is_named(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen3"])  # 2 query groups, 2 layers
    with pytest.raises(ValueError, match="num_query_groups=2 by tp"):
        ShardCoords(tp_size=4).check(dims)
    with pytest.raises(ValueError, match="num_layers=2 by pp"):
        ShardCoords(pp_size=4).check(dims)


def test_unknown_megatron_name_and_missing_rank_are_errors(models: dict[str, Path]) -> None:
    dims = load_dims(models["qwen3"])
    state = DictSource(_hf_state(models["qwen3"]))
    with pytest.raises(ValueError, match="has no HF mapping"):
        megatron_shard("decoder.layers.0.mlp.linear_fc3.weight", dims, ShardCoords(), state)
    coords = ShardCoords(tp_rank=1, tp_size=2)
    name = "decoder.layers.0.self_attention.linear_proj.weight"
    only_rank1 = hf_pieces(name, megatron_shard(name, dims, coords, state), dims, coords)
    with pytest.raises(ValueError, match="a rank's shard is missing"):
        assemble_hf(only_rank1, dims)
