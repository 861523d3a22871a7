"""utils.placement: per-node packing, the shipped cluster configs' acceptance cases, clear shortfalls."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.utils.placement import ClusterSpec, Placement, PlacementRequest, RoleRequest, plan_placement

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _place(name: str, cluster: str, *overrides: str) -> Placement:
    return build_run_plan(load_config_from_files(CONFIGS, name, list(overrides))).check_fits(
        ClusterSpec.parse(cluster)
    )


def _request(ranks: tuple[int, int], actors: tuple[int, int], **kw: object) -> PlacementRequest:
    base: dict[str, object] = dict(
        device_kind="GPU", device_kind_reason="test", actors_per_unit=1, colocated=False,
        trainer=RoleRequest(name="trainer rank", count=ranks[0], num_devices=ranks[1], num_cpus=1.0),
        generation=RoleRequest(name="generation actor", count=actors[0], num_devices=actors[1], num_cpus=1.0),
    )  # fmt: skip
    return PlacementRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_qwen3_30b_fills_eight_nodes_of_eight_exactly() -> None:
    placement = _place("grpo_qwen3_30b_a3b_asp_A3", "8x8")
    ranks, actors = placement.trainer_ranks, placement.generation_actors
    assert placement.request.device_kind == "NPU" and len(ranks) == 32 and len(actors) == 16
    assert [(r.node, r.devices) for r in ranks[:9]] == [(0, (d,)) for d in range(8)] + [(1, (0,))]
    assert {r.node for r in ranks} == {0, 1, 2, 3}
    # One GU's 4 actors of TP2 fill one node: GU g on node 4 + g (the config's "one GU per node").
    assert [(a.node, a.devices) for a in actors[:4]] == [(4, (0, 1)), (4, (2, 3)), (4, (4, 5)), (4, (6, 7))]
    assert [a.node for a in actors] == [4 + g for g in range(4) for _ in range(4)]
    assert [(c.name, c.index) for c in placement.control_actors] == [("control unit", 0)] + [
        ("generation unit", g) for g in range(4)
    ]
    used = {(s.node, d) for s in (*ranks, *actors) for d in s.devices}
    assert len(used) == 64  # every device once
    as_json = placement.to_dict()
    assert as_json["devices_used"] == 64 and as_json["generation_actors"][5] == {
        "gu": 1, "actor": 1, "node": 5, "devices": [2, 3], "cpus": 8.0
    }  # fmt: skip


def test_qwen3_30b_on_four_nodes_names_the_shortfall() -> None:
    with pytest.raises(ValueError) as err:
        _place("grpo_qwen3_30b_a3b_asp_A3", "4x8")
    assert str(err.value).startswith(
        "32 trainer ranks x 1 NPU + 16 generation actors x 2 NPU need 64 NPUs on nodes of 8; "
        "the cluster has 4 nodes x 8 = 32 NPUs: short by 32 NPUs"
    )


def test_upstream_hybrid_16_npus_is_split_in_ranks_over_two_nodes() -> None:
    placement = _place("grpo_qwen25_7b_A3", "2x8")
    assert placement.request.colocated and len(placement.trainer_ranks) == 16
    assert [r.node for r in placement.trainer_ranks] == [0] * 8 + [1] * 8
    # Rollout engines of infer TP2 run on the trainer's own devices (upstream's hybrid).
    assert [(e.node, e.devices) for e in placement.generation_actors] == [
        (n, (d, d + 1)) for n in (0, 1) for d in (0, 2, 4, 6)
    ]
    assert placement.to_dict()["devices_used"] == 16
    with pytest.raises(ValueError, match="short by 8 NPUs"):
        _place("grpo_qwen25_7b_A3", "1x8")


def test_without_a_megatron_layout_the_group_is_one_actor_that_fits_no_node() -> None:
    with pytest.raises(ValueError, match="a trainer rank of 16 NPUs fits no node of 8"):
        _place("grpo_qwen25_7b_A3", "2x8", "megatron_training.use_mcore_models=false")


def test_megatron_layout_must_divide_the_device_count() -> None:
    with pytest.raises(ValueError, match=r"TP 2 x PP 2 x CP 1 = 4 must divide it"):
        _place("grpo_qwen25_7b_A3", "2x8", "rl_config.actor_resource.num_npus=6")


def test_an_actor_bigger_than_every_node() -> None:
    with pytest.raises(ValueError, match="a generation actor of 16 GPUs fits no node of 8"):
        plan_placement(_request((1, 1), (1, 16)), ClusterSpec.uniform(4, 8, None))


def test_odd_sizes_that_fit_the_totals_but_not_the_nodes() -> None:
    # 3 ranks pack node 0 (1 device left there); 3-device actors then take nodes 1 and 2 and
    # leave 1 + 1 + 1 devices: the third actor fits nowhere although 12 = 12.
    with pytest.raises(
        ValueError, match=r"generation actor 2 \(3 GPU, 1 CPU\) fits no node .*free GPUs per node \[1, 1, 1\]"
    ):
        plan_placement(_request((3, 1), (3, 3)), ClusterSpec.uniform(3, 4, None))
    fitted = plan_placement(_request((3, 1), (2, 3)), ClusterSpec.uniform(3, 4, None))
    assert [(a.node, a.devices) for a in fitted.generation_actors] == [(1, (0, 1, 2)), (2, (0, 1, 2))]
    # Actors first-fit back into a trainer node's leftovers.
    mixed = plan_placement(_request((5, 1), (3, 2)), ClusterSpec.uniform(2, 8, None))
    assert [(a.node, a.devices) for a in mixed.generation_actors] == [(0, (5, 6)), (1, (0, 1)), (1, (2, 3))]


def test_cpus_per_node_are_checked_when_given() -> None:
    with pytest.raises(ValueError, match=r"actors need 4 CPU .* but the cluster has 2"):
        plan_placement(_request((2, 1), (2, 1)), ClusterSpec.uniform(1, 8, 2.0))
    # Devices free on node 0 but its CPUs are spent: the actor moves to node 1.
    spread = plan_placement(_request((2, 1), (1, 1)), ClusterSpec.uniform(2, 8, 2.0))
    assert [r.node for r in spread.trainer_ranks] == [0, 0] and spread.generation_actors[0].node == 1
    big = RoleRequest(name="trainer rank", count=1, num_devices=1, num_cpus=3.0)
    with pytest.raises(
        ValueError, match=r"a trainer rank asking 3 CPUs fits no node \(the largest has 2.5\)"
    ):
        plan_placement(_request((1, 1), (1, 1), trainer=big), ClusterSpec.uniform(2, 8, 2.5))


def test_colocated_engine_spanning_nodes_is_refused() -> None:
    request = _request((6, 1), (3, 2), colocated=True, actors_per_unit=None)
    with pytest.raises(
        ValueError, match=r"colocated generation actor 1 \(2 GPUs\) would span nodes \[0, 1\]"
    ):
        plan_placement(request, ClusterSpec.uniform(2, 3, None))


def test_cpu_only_configs_place_on_cpus_as_before() -> None:
    placement = _place("grpo_tiny_asp", "1x0x2")
    assert not placement.uses_devices and all(not s.devices for s in placement.generation_actors)
    with pytest.raises(ValueError, match="actors need .* CPU"):
        _place("grpo_tiny_asp", "1x0x0.5")
    # The --available form: one node with those resources.
    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_cpu"))
    assert len(plan.check_fits({"CPU": 1.0}).trainer_ranks) == 1


def test_one_device_kind_per_run_and_whole_devices() -> None:
    with pytest.raises(ValueError, match=r"asks for NPUs .* and GPUs"):
        _place("grpo_qwen3_30b_a3b_asp_A3", "8x8", "async_config.actor_resources.num_gpus=1")
    with pytest.raises(ValueError, match="num_gpus=0.5: placement hands out whole devices"):
        _place("grpo_tiny_cpu", "1x1", "rl_config.actor_resource.num_gpus=0.5")
    with pytest.raises(
        ValueError, match=r"asks for NPUs \(num_npus in rl_config.actor_resource\) but the cluster's"
    ):
        _place("grpo_qwen25_7b_A3", "2x0")
    gpu = _place("grpo_tiny_asp", "1x4", "async_config.actor_resources.num_gpus=1")
    assert gpu.request.device_kind == "GPU" and [a.devices for a in gpu.generation_actors] == [
        (0,),
        (1,),
        (2,),
        (3,),
    ]


def test_cluster_text() -> None:
    assert [n.num_devices for n in ClusterSpec.parse("2x8").nodes] == [8, 8]
    assert ClusterSpec.parse("2x8x96").nodes[1].num_cpus == 96.0
    for bad in ("8", "0x8", "8x", "8*8"):
        with pytest.raises(ValueError, match="write NODESxDEVICES"):
            ClusterSpec.parse(bad)
