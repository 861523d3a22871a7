"""The colocated hybrid on a megatron layout: each trainer rank hosts one TP rank of a rollout
engine (``workers/colocated_rank.py``). The pure parts here (shares, joins, the placement rule,
the engine arguments, the config checks); the real runs are in ``test_megatron_async_e2e.py``,
the shipped 7B recipe's rank group on fake NPUs in ``tests/cli/test_placement_dry_run.py``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mindspeed_rl.runtime.records import CompletedMinibatch, Sample, ScheduledMinibatch
from mindspeed_rl.workers.colocated_rank import EngineGrid, join_decodes, join_shares
from mindspeed_rl.workers.evaluator import HeldOutDecode

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_every_rank_maps_to_one_engine_and_tp_rank() -> None:
    grid = EngineGrid(engines=8, tp=2)
    assert grid.world_size == 16
    assert [grid.of_rank(r) for r in (0, 1, 2, 15)] == [(0, 0), (0, 1), (1, 0), (7, 1)]


@pytest.mark.parametrize("n", [3, 7, 8, 64])
def test_shares_cover_the_items_once_in_order(n: int) -> None:
    grid = EngineGrid(engines=3, tp=2)
    items = [f"p{i}" for i in range(n)]
    shares = [grid.share(items, e, "prompts") for e in range(3)] if n >= 3 else []
    assert [x for share in shares for x in share] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_fewer_items_than_engines_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="2 held-out prompts for 3 colocated rollout engines"):
        EngineGrid(engines=3, tp=1).share(["a", "b"], 0, "held-out prompts")


def _share(prompt_ids: tuple[str, ...], version: int, start: float) -> CompletedMinibatch:
    samples = tuple(
        Sample(prompt_id=p, sample_index=j, minibatch_id=5, response_token_ids=(1, 2),
               rollout_log_probs=(-0.1, -0.2), reward=None, policy_version=version,
               gu_id=0, actor_id=0, sent_at=0.0)
        for p in prompt_ids for j in range(2)
    )  # fmt: skip
    return CompletedMinibatch(minibatch_id=5, attempt=0, samples=samples, gu_id=0, actor_id=0,
                              policy_version=version, started_at=start, finished_at=start + 2.0)  # fmt: skip


def test_shares_join_into_the_minibatch_in_prompt_order() -> None:
    mb = ScheduledMinibatch(minibatch_id=5, prompt_ids=("a", "b", "c"), batch_group_id=0,
                            predicted_load=0.0, order_index=0)  # fmt: skip
    joined = join_shares(mb, [_share(("a", "b"), 3, 10.0), _share(("c",), 3, 11.0)])
    assert [(s.prompt_id, s.sample_index) for s in joined.samples] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("c", 0),
        ("c", 1),
    ]
    assert (joined.started_at, joined.finished_at, joined.policy_version) == (10.0, 13.0, 3)
    with pytest.raises(RuntimeError, match="a share was lost or generated twice"):
        join_shares(mb, [_share(("a", "b"), 3, 10.0)])
    with pytest.raises(RuntimeError, match=r"engines held weights \[2, 3\]"):
        join_shares(mb, [_share(("a", "b"), 3, 10.0), _share(("c",), 2, 11.0)])


def test_decodes_join_prompt_major_in_engine_order() -> None:
    first = HeldOutDecode(job_id=1, responses=((1,), (2,)), finish_reasons=("stop", "length"),
                          weights_version=4, generate_s=0.5)  # fmt: skip
    second = dataclasses.replace(first, responses=((3,),), finish_reasons=("stop",), generate_s=0.7)
    joined = join_decodes([first, second])
    assert joined.responses == ((1,), (2,), (3,)) and joined.finish_reasons == ("stop", "length", "stop")
    assert joined.generate_s == 0.7
    with pytest.raises(RuntimeError, match="engines held weights"):
        join_decodes([first, dataclasses.replace(second, weights_version=3)])


def test_the_hybrid_accepts_the_7b_recipes_eight_colocated_engines_and_refuses_them_uncolocated() -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.trainer.hybrid_cluster import HybridCluster
    from mindspeed_rl.utils.placement import ClusterSpec

    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_qwen25_7b_A3", ()))
    placement = plan.check_fits(ClusterSpec.parse("2x8"))
    assert len(placement.trainer_ranks) == 16 and len(placement.generation_actors) == 8
    grid = EngineGrid.of(plan.trainer.num_ranks, plan.rollout)
    assert grid == EngineGrid(engines=8, tp=2)
    grid.check_placement(placement)
    HybridCluster.check_placement(placement)  # upstream's layout: accepted
    apart = dataclasses.replace(placement, request=dataclasses.replace(placement.request, colocated=False))
    with pytest.raises(
        ValueError, match="without colocation drives one rollout engine, but the placement has 8"
    ):
        HybridCluster.check_placement(apart)


def test_each_engine_rank_asks_vllm_for_an_external_launcher_engine_and_sleeps_only_on_devices() -> None:
    """What every rank of the 7B recipe's engines hands vLLM on an accelerator (8 engines x TP2),
    and on a CPU host (no sleep mode there)."""
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.models.rollout.factory import vllm_options_from_generate_config
    from mindspeed_rl.models.rollout.vllm_engine import engine_kwargs
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.workers.colocated_rank import engine_keys

    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_qwen25_7b_A3", ()))
    grid = EngineGrid.of(plan.trainer.num_ranks, plan.rollout)
    keys = engine_keys(plan.rollout, grid, sleeps=True)
    kwargs = engine_kwargs(vllm_options_from_generate_config(keys), "/model", seed=0, on_cpu=False)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert (kwargs["data_parallel_size"], kwargs["tensor_parallel_size"]) == (8, 2)
    assert kwargs["enable_sleep_mode"] is True and kwargs["disable_custom_all_reduce"] is True
    on_cpu = engine_kwargs(
        vllm_options_from_generate_config(engine_keys(plan.rollout, grid, sleeps=False)),
        "/m",
        seed=0,
        on_cpu=True,
    )
    assert "enable_sleep_mode" not in on_cpu and on_cpu["distributed_executor_backend"] == "external_launcher"


def test_a_rank_count_the_engines_do_not_divide_is_refused() -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_qwen25_7b_A3", ()))
    with pytest.raises(
        ValueError, match="cannot host rollout engines of generate_config.infer_tensor_parallel_size=2"
    ):
        EngineGrid.of(3, plan.rollout)


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ("grpo_tiny_megatron", ("rl_config.colocate=true",), "colocate: true is the hybrid loop's layout"),
        (
            "grpo_tiny_cpu",
            ("rl_config.colocate=true", "rl_config.rollout_backend=hf"),
            "set rl_config.rollout_backend: vllm",
        ),
    ],
    ids=["async", "hf-engine"],
)
def test_cpu_colocation_outside_a_megatron_hybrid_is_refused_by_name(
    config: str, overrides: tuple[str, ...], message: str
) -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    with pytest.raises(ValueError, match=message):
        build_run_plan(load_config_from_files(CONFIGS, config, overrides))


def test_cpu_colocation_of_a_megatron_hybrid_plans_the_offload_switches() -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    keys = ("rl_config.pipeline=hybrid", "generate_config.offload_train_grad=true")
    assert build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_megatron", keys)).offload is None
    plan = build_run_plan(
        load_config_from_files(CONFIGS, "grpo_tiny_megatron", (*keys, "rl_config.colocate=true"))
    )
    assert plan.offload is not None and plan.offload.grad and not plan.offload.optimizer
