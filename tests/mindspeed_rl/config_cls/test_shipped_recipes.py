"""The recipes this fork ships for upstream's Qwen models (configs/, run by examples/grpo/*.sh and
examples/dapo/*.sh): each passes ``check_config`` and is placed, memory included, on a cluster of
its own size (Atlas A3: 16 NPUs per node)."""

from __future__ import annotations

import json

import pytest

from cli import check_config

# recipe -> (stage, cluster that holds exactly its rl_config.actor_resource.num_npus)
RECIPES = {
    "grpo_qwen25_7b_A3": ("ray_grpo", "1x16"),
    "grpo_qwen25_32b_A3": ("ray_grpo", "1x16"),
    "grpo_qwen3_8b_A3": ("ray_grpo", "1x16"),
    "grpo_qwen3_235b_a22b_A3": ("ray_grpo", "16x16"),
    "dapo_qwen25_32b_A3": ("ray_dapo", "1x16"),
    "dapo_qwen3_30b_a3b_A3": ("ray_dapo", "1x16"),
    "dapo_qwen3_32b_A3": ("ray_dapo", "1x16"),
}


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = check_config.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_passes_check_config_and_fits_its_cluster(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    stage, cluster = RECIPES[name]
    code, out, err = _check(capsys, "--config-name", name)
    assert code == 0, err
    resolved = json.loads(out)
    assert resolved["megatron_training"]["stage"] == stage
    assert "unknown key" not in err
    code, out, err = _check(capsys, "--config-name", name, "--cluster", cluster)
    assert code == 0, err
    placement = json.loads(out)
    nodes, per_node = map(int, cluster.split("x"))
    assert placement["device_kind"] == "NPU" and placement["devices_used"] == nodes * per_node
    memory = placement["memory_gb"]
    assert memory["problem"] is None
    assert all(rank["total"] <= memory["device_memory_gb"] for rank in memory["trainer_ranks"])


@pytest.mark.parametrize("name", sorted(n for n, (stage, _) in RECIPES.items() if stage == "ray_dapo"))
def test_dapo_recipes_turn_on_every_dapo_part(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = _check(capsys, "--config-name", name)
    assert code == 0, err
    rl = json.loads(out)["rl_config"]
    assert rl["clip_higher_enable"] and rl["token_level_loss"]
    assert rl["overlong_buffer_enable"] and rl["filter_groups_enable"]
    assert rl["filter_groups_metric"] == "acc_for_dapo" and rl["verifier_function"] == ["acc_for_dapo"]


def test_a_recipe_too_big_for_a_smaller_cluster_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # The 235B recipe does not fit upstream's A2 nodes (8 NPUs): its TP16 engines need 16 on one node.
    code, _, err = _check(capsys, "--config-name", "grpo_qwen3_235b_a22b_A3", "--cluster", "16x8")
    assert code == 2 and "a rollout engine of 16 NPUs fits no node of 8" in err
