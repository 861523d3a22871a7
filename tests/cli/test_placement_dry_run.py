"""``check_config --placement-dry-run --fake-cluster``: the shipped cluster configs, shrunk to a
laptop-sized fake cluster, land where the plan says (with the production runtime_env)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli import check_config

pytestmark = pytest.mark.integration


def _dry_run(capsys: pytest.CaptureFixture[str], name: str, cluster: str, *overrides: str) -> dict[str, Any]:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running in this process")
    code = check_config.main(
        ["--config-name", name, "--fake-cluster", cluster, "--placement-dry-run", *overrides]
    )
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out)
    assert code == (0 if result["ok"] else 2)
    return result


@pytest.mark.timeout(300)
def test_async_moe_layout_lands_on_the_planned_npus(capsys: pytest.CaptureFixture[str]) -> None:
    # grpo_qwen3_30b_a3b_asp_A3's shape at a quarter of its size: 4 trainer ranks (TP2 x EP2) on
    # node 0, one GU of two TP2 actors on node 1.
    result = _dry_run(
        capsys, "grpo_qwen3_30b_a3b_asp_A3", "2x4",
        "actor_config.tensor_model_parallel_size=2", "actor_config.expert_model_parallel_size=2",
        "rl_config.actor_resource.num_npus=4", "async_config.num_generation_units=1",
        "async_config.actors_per_unit=2",
    )  # fmt: skip
    assert result["ok"], result["problems"]
    ranks = [p for p in result["placeholders"] if p["role"] == "trainer_rank"]
    actors = [p for p in result["placeholders"] if p["role"] == "rollout_actor"]
    assert [(p["landed_node"], p["visible_devices"]) for p in ranks] == [(0, [d]) for d in range(4)]
    assert [(p["landed_node"], p["visible_devices"]) for p in actors] == [(1, [0, 1]), (1, [2, 3])]
    assert {p["device_index"] for p in result["placeholders"]} == {0}


@pytest.mark.timeout(300)
def test_colocated_hybrid_engines_span_their_ranks_devices(capsys: pytest.CaptureFixture[str]) -> None:
    # grpo_qwen25_7b_A3 as upstream runs it, on one node of 4: 4 ranks, 2 TP2 engines on their devices.
    result = _dry_run(capsys, "grpo_qwen25_7b_A3", "1x4", "rl_config.actor_resource.num_npus=4")
    assert result["ok"], result["problems"]
    engines = [p for p in result["placeholders"] if p["role"] == "rollout_actor"]
    assert [p["visible_devices"] for p in engines] == [[0, 1], [2, 3]]
    # The hybrid's own rank group (its group spec, ColocatedGroup, a gloo rendezvous): each rank
    # on its planned NPU, in its engine, at its TP rank.
    group = result["rank_group"]
    assert group["ok"] and (group["engines"], group["tp"]) == (2, 2)
    assert [(r["rank"], r["engine"], r["tp_rank"], r["visible_devices"]) for r in group["ranks"]] == [
        (0, 0, 0, [0]), (1, 0, 1, [1]), (2, 1, 0, [2]), (3, 1, 1, [3])
    ]  # fmt: skip
