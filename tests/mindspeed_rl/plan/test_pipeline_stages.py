"""Uneven pipeline stages and noop layers, torch-free: how upstream's keys resolve into real layers
per stage (``stages``), what each stage's ranks hold (``ShardCoords``, ``megatron_names``), and
what the memory planner counts per stage (noop layers hold nothing; recomputation's working set
is one micro-batch's)."""

from __future__ import annotations

import dataclasses

import pytest

from mindspeed_rl.models.training.megatron import stages, uneven_stages
from mindspeed_rl.models.training.megatron.layout import MegatronLayout, check_trainable
from mindspeed_rl.models.training.megatron.param_names import megatron_names
from mindspeed_rl.plan.memory import ModelShape, TrainerMemorySpec, activation_bytes, rank_parameters
from mindspeed_rl.weights.megatron_dims import GPTDims, ShardCoords


def test_num_layer_list_and_noop_layers_resolve_to_real_layers_per_stage() -> None:
    assert stages.stage_layers(num_layers=8, pipeline_parallel_size=2) == ()
    assert stages.stage_layers(num_layers=4, pipeline_parallel_size=2, num_layer_list="1,3") == (1, 3)
    assert stages.stage_layers(num_layers=64, pipeline_parallel_size=4, num_layer_list="16,17,16,15") == (
        16, 17, 16, 15,
    )  # fmt: skip
    # Qwen3-235B upstream: 96 positions at PP16, noops at 5 and 95 -> 94 real layers.
    qwen3_235b = stages.stage_layers(num_layers=96, pipeline_parallel_size=16, noop_layers="5,95")
    assert qwen3_235b == (5,) + (6,) * 14 + (5,) and sum(qwen3_235b) == 94
    # Both: positions from the list, noops taken out of the stage they fall in.
    assert stages.stage_layers(
        num_layers=7, pipeline_parallel_size=2, num_layer_list=[4, 3], noop_layers=[1, 2]
    ) == (2, 3)
    assert stages.real_num_layers(96, "5,95") == 94 and stages.real_num_layers(8, None) == 8


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        (
            {"num_layers": 4, "num_layer_list": "3,2"},
            "num_layer_list 3,2 must list one count >= 1 per pipeline",
        ),
        ({"num_layers": 4, "num_layer_list": "4"}, "summing to num_layers 4"),
        ({"num_layers": 4, "num_layer_list": "4,0"}, "one count >= 1"),
        ({"num_layers": 4, "num_layer_list": "two,2"}, "num_layer_list: expected comma-separated integers"),
        ({"num_layers": 5, "noop_layers": "4"}, "does not split over pipeline_model_parallel_size 2"),
        ({"num_layers": 4, "noop_layers": "4"}, "noop_layers 4: each must be a distinct layer index in 0..3"),
        ({"num_layers": 4, "noop_layers": "0,1"}, "leave pipeline stage 0 without a real layer"),
    ],
)
def test_lists_that_do_not_fit_name_the_key(kwargs: dict[str, object], phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        stages.stage_layers(pipeline_parallel_size=2, **kwargs)  # type: ignore[arg-type]


DIMS = GPTDims(
    family="qwen3", num_layers=4, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
    num_query_groups=2, head_dim=16, vocab_size=100, max_position_embeddings=256, rope_theta=1e6,
    norm_epsilon=1e-6, tied_embeddings=False, qkv_bias=False, qk_layernorm=True,
)  # fmt: skip


def test_each_stage_holds_and_names_its_own_layers() -> None:
    first = ShardCoords(pp_rank=0, pp_size=2, stage_layers=(1, 3))
    last = ShardCoords(pp_rank=1, pp_size=2, stage_layers=(1, 3))
    first.check(DIMS)
    assert (first.layer_offset(DIMS), last.layer_offset(DIMS)) == (0, 1)
    layers = {n.split(".")[2] for n in megatron_names(DIMS, last) if n.startswith("decoder.layers.")}
    assert layers == {"0", "1", "2"}
    assert "embedding.word_embeddings.weight" in megatron_names(DIMS, first)
    with pytest.raises(ValueError, match="the model has 4 layers"):
        ShardCoords(pp_rank=0, pp_size=2, stage_layers=(1, 2)).check(DIMS)


def test_the_layout_refuses_stages_the_model_does_not_have() -> None:
    layout = MegatronLayout(pipeline_model_parallel_size=2, stage_layers=(1, 2))
    with pytest.raises(ValueError, match="the pipeline stages hold 3 real layers"):
        check_trainable(DIMS, layout, "cpu")
    with pytest.raises(ValueError, match=">= 1 layer to each of the 2 pipeline stages"):
        MegatronLayout(pipeline_model_parallel_size=2, stage_layers=(4, 0))
    # block recomputes the first N layers of each stage: N up to the longest stage is fine.
    check_trainable(
        DIMS,
        dataclasses.replace(layout, stage_layers=(1, 3), recompute_granularity="full",
                            recompute_method="block", recompute_num_layers=3),
        "cpu",
    )  # fmt: skip


def test_megatron_core_0_19_gets_its_layout_and_0_12_the_wrap() -> None:
    assert uneven_stages.layout_list((1, 3)) == [
        ["embedding", "decoder"],
        ["decoder", "decoder", "decoder", "loss"],
    ]

    @dataclasses.dataclass
    class WithLayout:
        pipeline_model_parallel_layout: object = None

    @dataclasses.dataclass
    class WithoutLayout:
        num_layers: int = 4

    assert uneven_stages.config_kwargs(WithLayout, (1, 3)) == {
        "pipeline_model_parallel_layout": [
            ["embedding", "decoder"],
            ["decoder", "decoder", "decoder", "loss"],
        ]
    }
    assert (
        uneven_stages.config_kwargs(WithoutLayout, (1, 3)) == {}
        and uneven_stages.config_kwargs(WithLayout, ()) == {}
    )


SHAPE = ModelShape(
    num_layers=64, hidden_size=5120, ffn_hidden_size=27648, num_attention_heads=40, num_query_groups=8,
    head_dim=128, vocab_size=152064, tied_embeddings=False, qkv_bias=True, qk_layernorm=False,
)  # fmt: skip


def _spec(**kw: object) -> TrainerMemorySpec:
    values: dict[str, object] = {
        "shape": SHAPE, "tp": 4, "pp": 4, "ep": 1, "world_size": 16, "make_vocab_size_divisible_by": 1,
        "param_dtype": "bfloat16", "grads_in_fp32": False, "distributed_optimizer": True, "reference": True,
        "micro_batch_size": 2, "seq_length": 3072, "sequence_parallel": True, "flash_attention": True,
        "recompute_granularity": None,
    }  # fmt: skip
    return TrainerMemorySpec(**{**values, **kw})  # type: ignore[arg-type]


def test_per_stage_parameters_and_activations_follow_the_stages() -> None:
    even, uneven = _spec(), _spec(stage_layers=(16, 17, 16, 15))
    layer = rank_parameters(SHAPE, tp=4, pp=4, ep=1, pp_rank=1, divisible_by=1, stage_layers=(16, 17, 16, 15))
    base = rank_parameters(SHAPE, tp=4, pp=4, ep=1, pp_rank=1, divisible_by=1)
    assert layer.total - base.total == base.total // 16  # one more layer of a middle stage
    assert activation_bytes(uneven, pp_rank=1) == pytest.approx(activation_bytes(even, pp_rank=1) * 17 / 16)
    assert activation_bytes(uneven, pp_rank=0) == activation_bytes(even, pp_rank=0)


def test_full_recomputation_rebuilds_one_chunk_once_not_per_micro_batch_in_flight() -> None:
    uniform = _spec(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=4)
    none = _spec()
    per_layer = activation_bytes(none, pp_rank=1) / (3 * 16)  # stage 1: 3 micro-batches of 16 layers
    layer_input = 2 * 3072 * 2 * 5120 / 4  # 2sbh / TP under sequence parallelism
    # Every micro-batch in flight keeps its 16 layer inputs; one chunk of 4 layers is rebuilt once.
    assert activation_bytes(uniform, pp_rank=0) == pytest.approx(4 * 16 * layer_input + 4 * per_layer)
    assert activation_bytes(uniform, pp_rank=0) - activation_bytes(uniform, pp_rank=1) == pytest.approx(
        16 * layer_input
    )
    # block: the first 6 layers of a stage keep only their input, the other 10 everything.
    block = dataclasses.replace(uniform, recompute_method="block", recompute_num_layers=6)
    assert activation_bytes(block, pp_rank=1) == pytest.approx(
        3 * (6 * layer_input + 10 * per_layer) + per_layer
    )
