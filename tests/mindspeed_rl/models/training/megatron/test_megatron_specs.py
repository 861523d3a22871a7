"""Layer spec per device, the trainability refusal, and the TransformerConfig built from a layout.

The spec choice and the refusal are pure (fast tier). The ``needs_megatron`` cases build
megatron's real config and spec (no process group needed), so they check field names and validity
rules of the installed megatron-core (0.19.2 in .venv, 0.12.1 under ``make test-mcore012``);
importing megatron takes seconds, hence the integration mark.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import inspect
from typing import Any

import pytest
import torch

from mindspeed_rl.models.training.megatron import model as model_module
from mindspeed_rl.models.training.megatron.layout import DeviceKind, MegatronLayout, check_trainable
from mindspeed_rl.weights.megatron_dims import GPTDims

DENSE = GPTDims(
    family="qwen3",
    num_layers=4,
    hidden_size=64,
    ffn_hidden_size=96,
    num_attention_heads=4,
    num_query_groups=2,
    head_dim=16,
    vocab_size=100,
    max_position_embeddings=128,
    rope_theta=10000.0,
    norm_epsilon=1e-6,
    tied_embeddings=False,
    qkv_bias=False,
    qk_layernorm=True,
)
MOE = dataclasses.replace(
    DENSE, family="qwen3_moe", num_experts=4, moe_ffn_hidden_size=32, moe_topk=2, norm_topk_prob=True
)


def _fake_transformer_engine(monkeypatch: pytest.MonkeyPatch, importable: bool) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if name in ("transformer_engine", "transformer_engine_torch"):  # TE and its torch extension
            return importlib.machinery.ModuleSpec(name, None) if importable else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# find_spec, not importorskip: importing megatron at collection would slow every test tier.
needs_megatron = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core not installed (make setup installs it)",
)

LOCAL = "get_gpt_layer_local_spec"
TE = "get_gpt_layer_with_transformer_engine_spec"


@pytest.mark.parametrize(
    ("device", "te", "dims", "builder", "kwargs"),
    [
        ("cpu", False, DENSE, LOCAL, {"moe_grouped_gemm": False, "normalization": "RMSNorm"}),
        ("cpu", True, MOE, LOCAL, {"moe_grouped_gemm": False, "normalization": "RMSNorm"}),
        ("cuda", True, DENSE, TE, {"moe_grouped_gemm": False}),
        ("cuda", True, MOE, TE, {"moe_grouped_gemm": True}),
        ("cuda", False, MOE, LOCAL, {"moe_grouped_gemm": False, "normalization": "RMSNorm"}),
        # MindSpeed creates dummy transformer_engine modules: importable, but not the spec to build.
        ("npu", True, MOE, LOCAL, {"moe_grouped_gemm": False, "normalization": "RMSNorm"}),
    ],
)
def test_spec_builder_and_kwargs_per_device(
    monkeypatch: pytest.MonkeyPatch,
    device: DeviceKind,
    te: bool,
    dims: GPTDims,
    builder: str,
    kwargs: dict[str, Any],
) -> None:
    _fake_transformer_engine(monkeypatch, te)
    choice = model_module.layer_spec_choice(dims, device)
    assert choice.builder == builder
    assert choice.kwargs == {"num_experts": dims.num_experts, "qk_layernorm": True, **kwargs}


@pytest.mark.integration
@needs_megatron
def test_build_layer_spec_calls_the_chosen_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core.models.gpt import gpt_layer_specs

    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(gpt_layer_specs, TE, lambda **kw: calls.append((TE, kw)) or "te-spec")
    _fake_transformer_engine(monkeypatch, True)
    choice = model_module.layer_spec_choice(MOE, "cuda")
    assert model_module.build_layer_spec(choice) == "te-spec"
    assert calls == [(TE, choice.kwargs)]


@pytest.mark.integration
@needs_megatron
@pytest.mark.parametrize("dims", [DENSE, MOE], ids=["dense", "moe"])
def test_spec_kwargs_are_accepted_by_the_installed_megatron(
    monkeypatch: pytest.MonkeyPatch, dims: GPTDims
) -> None:
    from megatron.core.models.gpt import gpt_layer_specs

    _fake_transformer_engine(monkeypatch, True)
    te = model_module.layer_spec_choice(dims, "cuda")
    # 0.19.2's builder forwards *args/**kwargs to ..._submodules; 0.12.1's takes them itself.
    target = getattr(gpt_layer_specs, te.builder.replace("_spec", "_submodules"), None)
    inspect.signature(target or getattr(gpt_layer_specs, te.builder)).bind(**te.kwargs)
    # The local spec builds without TransformerEngine: build it for real.
    local = model_module.build_layer_spec(model_module.layer_spec_choice(dims, "cpu"))
    assert local.submodules.self_attention.submodules.q_layernorm is not None


# --- check_trainable -------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_defaults_train_everywhere(monkeypatch: pytest.MonkeyPatch, device: DeviceKind) -> None:
    _fake_transformer_engine(monkeypatch, False)
    for dims in (DENSE, MOE, True, False):
        check_trainable(dims, MegatronLayout(), device)
        check_trainable(
            dims, MegatronLayout(pipeline_model_parallel_size=2, expert_model_parallel_size=2), device
        )


MOE_TP2 = MegatronLayout(tensor_model_parallel_size=2)


@pytest.mark.parametrize(
    ("device", "te", "model", "layout", "fragments"),
    [
        # MoE at TP > 1 without SP: where SP can be built, the fix is to turn it on ...
        ("npu", False, MOE, MOE_TP2, ["actor_config.sequence_parallel", "tensor_model_parallel_size=2", "set actor_config.sequence_parallel: true"]),
        ("cuda", True, True, MOE_TP2, ["actor_config.sequence_parallel", "set actor_config.sequence_parallel: true"]),
        # ... where it cannot (local spec), to keep TP at 1.
        ("cpu", False, MOE, MOE_TP2, ["actor_config.sequence_parallel", "keep tensor_model_parallel_size: 1"]),
        ("cuda", False, MOE, MOE_TP2, ["keep tensor_model_parallel_size: 1"]),
        # megatron-core 0.12.1 also refuses EP > 1 with TP > 1 without SP, experts or not.
        ("npu", False, DENSE, MegatronLayout(tensor_model_parallel_size=2, expert_model_parallel_size=2), ["expert_model_parallel_size > 1"]),
        # SP on the local spec, and SP without TP.
        ("cpu", False, DENSE, MegatronLayout(tensor_model_parallel_size=2, sequence_parallel=True), ["sequence_parallel: true cannot be built on CPU", "torch RMSNorm"]),
        ("cuda", False, DENSE, MegatronLayout(tensor_model_parallel_size=2, sequence_parallel=True), ["CUDA without TransformerEngine"]),
        ("npu", False, DENSE, MegatronLayout(sequence_parallel=True), ["needs tensor_model_parallel_size > 1"]),
        ("cpu", False, DENSE, MegatronLayout(use_flash_attn=True), ["actor_config.use_flash_attn", "CPU"]),
        # Recompute: megatron's rules.
        ("npu", False, DENSE, MegatronLayout(recompute_method="uniform"), ["need actor_config.recompute_granularity: full"]),
        ("npu", False, DENSE, MegatronLayout(recompute_granularity="full", recompute_num_layers=1), ["recompute_method in ('uniform', 'block')"]),
        ("npu", False, DENSE, MegatronLayout(recompute_granularity="full", recompute_method="block"), ["recompute_num_layers between 1 and 4"]),
        ("npu", False, DENSE, MegatronLayout(pipeline_model_parallel_size=2, recompute_granularity="full", recompute_method="block", recompute_num_layers=3), ["between 1 and 2"]),
        ("npu", False, DENSE, MegatronLayout(recompute_granularity="selective", recompute_num_layers=2), ["selective recomputes core attention only"]),
        ("npu", False, DENSE, MegatronLayout(recompute_granularity="layers"), ["must be one of ('full', 'selective')"]),
    ],
)  # fmt: skip
def test_untrainable_layouts_are_refused_naming_the_keys_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
    device: DeviceKind,
    te: bool,
    model: GPTDims | bool,
    layout: MegatronLayout,
    fragments: list[str],
) -> None:
    _fake_transformer_engine(monkeypatch, te)
    with pytest.raises(ValueError) as err:
        check_trainable(model, layout, device)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("device", "te", "layout"),
    [
        ("npu", False, MegatronLayout(tensor_model_parallel_size=4, expert_model_parallel_size=4, sequence_parallel=True, use_flash_attn=True)),
        ("cuda", True, MegatronLayout(tensor_model_parallel_size=2, sequence_parallel=True, use_flash_attn=True)),
        ("npu", False, MegatronLayout(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=4)),
        ("cpu", False, MegatronLayout(recompute_granularity="selective")),
    ],
)  # fmt: skip
def test_trainable_layouts_pass(
    monkeypatch: pytest.MonkeyPatch, device: DeviceKind, te: bool, layout: MegatronLayout
) -> None:
    _fake_transformer_engine(monkeypatch, te)
    check_trainable(MOE, layout, device)


def test_te_without_its_torch_extension_is_refused_with_the_missing_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if name == "transformer_engine":
            return importlib.machinery.ModuleSpec(name, None)
        return None if name == "transformer_engine_torch" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError, match="pip install --no-build-isolation transformer-engine-torch"):
        model_module.layer_spec_choice(DENSE, "cuda")
    assert model_module.layer_spec_choice(DENSE, "npu").builder == LOCAL  # only CUDA asks


def test_the_te_answer_can_come_from_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_transformer_engine(monkeypatch, False)  # a driver without TE planning for TE hosts
    layout = MegatronLayout(tensor_model_parallel_size=2, sequence_parallel=True)
    check_trainable(MOE, layout, "cuda", transformer_engine=True)
    with pytest.raises(ValueError, match="CUDA without TransformerEngine"):
        check_trainable(MOE, layout, "cuda")


# --- TransformerConfig from a layout (real megatron-core) ------------------------------------


def _config(dims: GPTDims, layout: MegatronLayout, device: DeviceKind = "cpu") -> Any:
    return model_module.transformer_config(dims, layout, param_dtype="float32", device_kind=device)


@pytest.mark.integration
@needs_megatron
def test_default_cpu_config_keeps_every_switch_off() -> None:
    config = _config(DENSE, MegatronLayout())
    assert (config.sequence_parallel, config.recompute_granularity, config.variable_seq_lengths) == (
        False,
        None,
        False,
    )
    assert not (config.bias_activation_fusion or config.masked_softmax_fusion or config.apply_rope_fusion)


@pytest.mark.integration
@needs_megatron
def test_layout_switches_reach_the_config() -> None:
    layout = MegatronLayout(
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        recompute_granularity="full",
        recompute_method="block",
        recompute_num_layers=2,
        use_fused_swiglu=True,
    )
    config = _config(MOE, layout, "npu")
    assert (config.sequence_parallel, config.tensor_model_parallel_size) == (True, 2)
    assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == (
        "full",
        "block",
        2,
    )
    assert config.bias_activation_fusion is True  # MindSpeed's npu_swiglu sits behind it
    assert (config.moe_token_dispatcher_type, config.moe_grouped_gemm) == ("alltoall", False)


@pytest.mark.integration
@needs_megatron
def test_pipelines_carry_variable_widths_unless_the_allgather_dispatcher_refuses() -> None:
    pp2 = MegatronLayout(pipeline_model_parallel_size=2)
    dense = _config(DENSE, pp2)
    assert dense.variable_seq_lengths is True
    assert _config(MOE, pp2).variable_seq_lengths is False  # CPU MoE: allgather
    assert _config(MOE, pp2, "npu").variable_seq_lengths is True  # alltoall


def test_the_build_refuses_what_check_trainable_refuses() -> None:
    with pytest.raises(ValueError) as built:
        _config(MOE, MOE_TP2)
    with pytest.raises(ValueError) as checked:
        check_trainable(MOE, MOE_TP2, "cpu")
    assert str(built.value) == str(checked.value)


RECOMPUTE = [
    (granularity, method, count)
    for granularity in (None, "full", "selective")
    for method in (None, "uniform", "block")
    for count in (None, 1, 4)
]


@pytest.mark.integration
@needs_megatron
@pytest.mark.parametrize(("granularity", "method", "count"), RECOMPUTE)
def test_recompute_rules_agree_with_megatron(
    monkeypatch: pytest.MonkeyPatch, granularity: str | None, method: str | None, count: int | None
) -> None:
    layout = MegatronLayout(
        recompute_granularity=granularity, recompute_method=method, recompute_num_layers=count
    )
    try:
        check_trainable(DENSE, layout, "cpu")
        ours = True
    except ValueError:
        ours = False
    monkeypatch.setattr(model_module, "check_trainable", lambda *a, **k: None)
    if granularity is None:
        # Without a granularity the engine passes no recompute field at all (megatron ignores them).
        _config(DENSE, layout)
        assert ours == (method is None and count is None)
        return
    try:
        _config(DENSE, layout)
        theirs = True
    except ValueError:
        theirs = False
    # One deliberate difference: megatron accepts a recompute_method under selective and ignores
    # it; a key that does nothing is refused here instead.
    ignored_by_megatron = granularity == "selective" and method is not None and count is None
    assert theirs == (ours or ignored_by_megatron), (layout, ours, theirs)


# --- split-weight attributes (megatron-core 0.12.1 leaves them out without initialisation) ----


@pytest.mark.integration
@needs_megatron
def test_split_weights_get_their_tensor_parallel_attributes_once() -> None:
    from megatron.core import tensor_parallel

    def bare(cls: type) -> torch.nn.Module:
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.weight = torch.nn.Parameter(torch.zeros(2, 2))
        return module

    model = torch.nn.ModuleDict(
        {
            "row": bare(tensor_parallel.RowParallelLinear),
            "column": bare(tensor_parallel.ColumnParallelLinear),
            "plain": torch.nn.Linear(2, 2),
        }
    )
    assert model_module.mark_tensor_parallel_weights(model) == 2
    row, column = model["row"].weight, model["column"].weight
    assert (row.tensor_model_parallel, row.partition_dim, column.partition_dim) == (True, 1, 0)
    assert not hasattr(model["plain"].weight, "tensor_model_parallel")
    assert model_module.mark_tensor_parallel_weights(model) == 0  # already marked: left as is
