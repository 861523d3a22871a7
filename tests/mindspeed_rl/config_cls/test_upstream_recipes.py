"""``check_config`` on upstream-style recipes (``upstream_recipes/``, written for these tests in
upstream's layout and key set): the GRPO ones pass, placed on a cluster of their own size; the
families this framework does not train exit 2 naming the feature, never "unknown key"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import check_config
from mindspeed_rl.models.rewards import get_verifier

RECIPES = Path(__file__).with_name("upstream_recipes")

# recipe -> the cluster (nodes x NPUs per node) that holds exactly its rl_config.actor_resource.
GRPO = {
    "grpo_qwen3_8b_A3": "1x16",
    "grpo_qwen25_32b_A3": "2x16",
    "grpo_qwen3_235b_a22b_A3": "16x16",
    "dapo_qwen3_32b_A3": "1x16",  # DAPO: acc_for_dapo, overlong penalty, dynamic sampling
    "dapo_qwen25_7b_A2_multi_turn": "1x8",  # multi-turn with the code tool, scored by retool_reward
}
# recipe -> phrases every one of which its error names.
REFUSED = {
    "grpo_lora_qwen25_32b_A2": ["megatron_training.lora_r: LoRA is not supported",
                                "megatron_training.lora_target_modules: LoRA is not supported",
                                "rl_config.share_backbone: LoRA is not supported"],
    "ppo_qwen25_32b_A3": ["critic_config: PPO with a critic is not supported",
                          "rl_config.critic_resource: PPO with a critic is not supported",
                          "megatron_training.stage: this stage is not supported"],
    "dpo_qwen3_30b_a3b_A3": ["megatron_training.dpo_loss_type: DPO is not supported",
                             "megatron_training.is_pairwise_dataset: DPO is not supported",
                             "megatron_training.stage: this stage is not supported"],
    "grpo_deepseek_v3_A3": ["model.deepseekv3_671b.multi_latent_attention: multi-latent attention (DeepSeek) is not",
                            "model.deepseekv3_671b.rope_scaling_type: yarn",
                            "model.deepseekv3_671b.moe_router_score_function: DeepSeek-style MoE routing",
                            "model.deepseekv3_671b.spec: custom layer specs are not supported"],
}  # fmt: skip


def _check(capsys: pytest.CaptureFixture[str], name: str, *args: str) -> tuple[int, str, str]:
    code = check_config.main(["--config-dir", str(RECIPES), "--config-name", name, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_recipe_is_exercised() -> None:
    assert {p.stem for p in RECIPES.glob("*.yaml")} == set(GRPO) | set(REFUSED)


@pytest.mark.parametrize("name", sorted(GRPO))
def test_upstream_grpo_recipes_pass_and_fit_their_cluster(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out, err = _check(capsys, name)
    assert code == 0, err
    assert json.loads(out)["megatron_training"]["stage"] == name.split("_")[0].replace(
        "grpo", "ray_grpo"
    ).replace("dapo", "ray_dapo")
    code, out, err = _check(capsys, name, "--cluster", GRPO[name])
    assert code == 0, err
    placement = json.loads(out)
    nodes, per_node = map(int, GRPO[name].split("x"))
    assert placement["device_kind"] == "NPU" and placement["devices_used"] == nodes * per_node


def test_upstream_only_keys_are_listed_with_their_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _check(capsys, "grpo_qwen25_32b_A3", "--list-inert")
    assert code == 0, err
    listed = {line.split(": ", 1)[0] for line in out.splitlines()}
    assert {
        "megatron_training.no_pad_to_seq_lengths", "rl_config.hccl_buffersize", "rl_config.reward_dispatch_size",
        "rl_config.actor_update_dispatch_size", "megatron_training.reset_position_ids",
    } <= listed  # fmt: skip
    code, out, _ = _check(capsys, "grpo_qwen3_235b_a22b_A3", "--list-inert")
    listed = {line.split(": ", 1)[0] for line in out.splitlines()}
    assert {
        "model.qwen3_235b_a22b.spec", "megatron_training.shape_order", "generate_config.num_scheduler_steps",
    } <= listed  # fmt: skip
    assert "megatron_training.swap_optimizer" not in listed  # MindSpeed's swap optimizer acts on NPU


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_families_exit_2_naming_the_feature(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out, err = _check(capsys, name)
    assert code == 2 and out == ""
    for phrase in REFUSED[name]:
        assert phrase in err, phrase
    assert "unknown key" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("override", "phrase"),
    [
        # Noop layers and uneven stages train (issue #42); lists that do not fit the model are named.
        ("actor_config.noop_layers='5,95'", "actor_config.noop_layers 5,95: each must be a distinct layer"),
        ("actor_config.num_layer_list='24,23'", "actor_config.num_layer_list 24,23 must list one count"),
        ("model.qwen3_235b_a22b.attention_bias=true", "attention_bias: true (bias on the Q/K/V and output"),
        ("model.qwen3_235b_a22b.moe_router_score_function=sigmoid", "DeepSeek-style MoE routing"),
    ],
)
def test_architecture_refusals_on_the_moe_recipe(
    capsys: pytest.CaptureFixture[str], override: str, phrase: str
) -> None:
    code, _, err = _check(capsys, "grpo_qwen3_235b_a22b_A3", override)
    assert code == 2 and phrase in err, err


def test_the_dapo_recipe_checks_its_filter_metric(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _check(capsys, "dapo_qwen3_32b_A3", "rl_config.filter_groups_metric=format")
    assert code == 2 and "rl_config.filter_groups_metric" in err, err


def test_upstream_reward_names_resolve_to_upstreams_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    # Upstream's PPO accuracy is its math_17k_acc check (last boxed answer, 1 / 0).
    assert get_verifier("acc_for_ppo") is get_verifier("math_17k_acc")
    for name in ("base_acc", "math_17k_acc", "math_verify_reward", "acc_for_ppo", "acc_for_dapo"):
        code, _, err = _check(capsys, "grpo_qwen3_8b_A3", f"rl_config.verifier_function=[{name}]")
        assert code == 0, (name, err)
    code, _, err = _check(capsys, "grpo_qwen3_8b_A3", "rl_config.verifier_function=[acc_for_dap]")
    assert code == 2 and "unknown verifier 'acc_for_dap'" in err
