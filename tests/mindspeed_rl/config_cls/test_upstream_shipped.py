"""Upstream MindSpeed-RL's own Qwen GRPO/DAPO recipes and its two integrated system-test configs,
as upstream ships them (``upstream_shipped/``: Ascend/MindSpeed-RL master 05a90d7, comments
dropped, only model and data paths changed), through ``check_config`` and ``--cluster`` at their
own size. Each passes, or is refused naming the feature it needs (never as an unknown key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import check_config
from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan

SHIPPED = Path(__file__).with_name("upstream_shipped")
CONFIGS, ST = SHIPPED / "configs", SHIPPED / "st"

# recipe -> (folder, the cluster that holds its actor_resource: A3 nodes have 16 NPUs, A2 nodes 8).
RUNS = {
    "grpo_qwen25_7b_A3": (CONFIGS, "1x16"),
    "grpo_qwen25_32b_A2": (CONFIGS, "2x8"),
    "grpo_qwen3_8b_A3": (CONFIGS, "1x16"),
    "dapo_qwen25_32b_A3": (CONFIGS, "1x16"),
    "dapo_qwen3_32b_A3": (CONFIGS, "1x16"),
    "dapo_qwen3_30b_a3b_A3": (CONFIGS, "1x16"),  # moe_tp_extend_ep: experts over TP x EP
    "test_grpo_trainer_qwen25_7b_integrated": (ST, "1x8"),  # mini_batch_size 64 > 4 prompts
    "test_dapo_trainer_qwen25_7b_integrated": (ST, "1x8"),  # 2 kept prompts per iteration of 8
    # Long-context DAPO: context parallel 2 (megatron_cp_algo) at TP8 PP2 over 64 NPUs.
    "dapo_qwen25_32b_A2_20k": (CONFIGS, "8x8"),
    "dapo_qwen25_32b_A3_32k": (CONFIGS, "4x16"),
    # Multi-turn DAPO with the code tool (retool_config.yaml) and upstream's retool_reward.
    "dapo_qwen25_7b_A2_multi_turn": (CONFIGS, "1x8"),
    # Noop layers 5,95 (94 real layers at PP16); swap_optimizer: MindSpeed keeps the optimizer state
    # on the host between steps, so offload_train_optimizer: false leaves nothing of it on the device
    # when vLLM starts, and a step holds one 1/16 chunk.
    "grpo_qwen3_235b_a22b_A2": (CONFIGS, "16x8"),
}
# recipe -> phrases its error names: the feature, not an unknown key.
REFUSED = {
    "grpo_lora_qwen25_32b_A2": ["megatron_training.lora_r: LoRA is not supported"],
}


# recipe -> (override, phrases of check_config's colocated start-up refusal, issue #39 defect 5):
# without upstream's swap_optimizer the 235B recipe's offload_train_optimizer: false keeps the
# optimizer state on the device when vLLM starts, above what gpu_memory_utilization 0.85 leaves.
REFUSED_AT_START = {
    "grpo_qwen3_235b_a22b_A2": (
        "megatron_training.swap_optimizer=false",
        [
            "colocated start-up",
            "(1 - generate_config.gpu_memory_utilization 0.85) x 64 GB",
            "set generate_config.offload_train_optimizer: true",
        ],
    ),
}


# recipe -> (cluster, what --cluster's memory check names): accepted, placed, but over its device.
OVER_MEMORY = {
    # num_layer_list 16,17,16,15 at TP4 PP4 DP1: stage 0 holds 16 layers and 4 micro-batches in
    # flight, each counted at max_prompt_length + max_tokens per sample (use_remove_padding packs
    # the actual tokens, but a micro-batch of responses cut at max_tokens reaches that too); the
    # distributed optimizer has DP 1 to shard over, and the reference stays on the device.
    "grpo_qwen25_32b_A3": ("1x16", "trainer rank 0 needs 64.4 GB of its 64 GB device"),
}


def _check(capsys: pytest.CaptureFixture[str], folder: Path, name: str, *args: str) -> tuple[int, str, str]:
    code = check_config.main(["--config-dir", str(folder), "--config-name", name, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_shipped_recipe_is_exercised() -> None:
    shipped = {p.stem for p in CONFIGS.glob("*.yaml")} | {p.stem for p in ST.glob("*.yaml")}
    assert shipped == set(RUNS) | set(REFUSED) | set(REFUSED_AT_START) | set(OVER_MEMORY)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_shipped_recipe_passes_and_fits_its_own_cluster(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    folder, cluster = RUNS[name]
    code, out, err = _check(capsys, folder, name)
    assert code == 0, err
    assert "unknown key" not in err
    code, out, err = _check(capsys, folder, name, "--cluster", cluster)
    assert code == 0, err
    placement = json.loads(out)
    nodes, per_node = map(int, cluster.split("x"))
    assert placement["device_kind"] == "NPU" and placement["devices_used"] == nodes * per_node
    assert placement["memory_gb"]["problem"] is None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_shipped_recipe_refused_names_the_feature(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = _check(capsys, CONFIGS, name)
    assert code == 2 and out == ""
    for phrase in REFUSED[name]:
        assert phrase in err, err
    assert "unknown key" not in err and "Traceback" not in err


@pytest.mark.parametrize("name", sorted(REFUSED_AT_START))
def test_shipped_recipe_that_would_not_start_its_engines_is_refused_naming_the_key(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    override, phrases = REFUSED_AT_START[name]
    code, out, err = _check(capsys, CONFIGS, name, override)
    assert code == 2 and "unknown key" not in err and "Traceback" not in err
    for phrase in phrases:
        assert phrase in err, err
    fixed = _check(capsys, CONFIGS, name, override, "generate_config.offload_train_optimizer=true")
    assert fixed[0] == 0, fixed[2]


def test_swap_optimizer_keeps_the_235b_optimizer_state_off_the_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Honoured on NPU (MindSpeed's swap optimizer), so not listed inert; each rank's optimizer term
    # is one swap chunk, well under its 1/16 x 12 bytes x (the stage's experts: EP8 of 128, DP 1).
    code, out, err = _check(capsys, CONFIGS, "grpo_qwen3_235b_a22b_A2", "--list-inert")
    assert code == 0 and "swap_optimizer" not in out
    code, out, err = _check(capsys, CONFIGS, "grpo_qwen3_235b_a22b_A2", "--cluster", "16x8")
    assert code == 0, err
    memory = json.loads(out)["memory_gb"]
    assert "optimizer_state" not in memory["colocated_start"]
    code, out, err = _check(
        capsys,
        CONFIGS,
        "grpo_qwen3_235b_a22b_A2",
        "--cluster",
        "16x8",
        "megatron_training.swap_optimizer=false",
    )
    whole = json.loads(out)["memory_gb"]
    for swapped, kept in zip(memory["trainer_ranks"], whole["trainer_ranks"], strict=True):
        assert swapped["optimizer_state"] < kept["optimizer_state"] / 4
        assert swapped["activations"] == kept["activations"]


def test_moe_tp_extend_ep_spreads_whole_experts_over_tp_x_ep() -> None:
    config = load_config_from_files(CONFIGS, "dapo_qwen3_30b_a3b_A3")  # TP4 EP2, 128 experts, 16 NPUs
    layout = build_run_plan(config).trainer.megatron
    assert layout is not None
    assert (layout.expert_model_parallel_size, layout.expert_tensor_parallel_size) == (8, 1)
    assert layout.data_parallel_size(16) == 4
    plain = build_run_plan(
        load_config_from_files(CONFIGS, "dapo_qwen3_30b_a3b_A3", ["actor_config.moe_tp_extend_ep=false"])
    )
    assert plain.trainer.megatron is not None and plain.trainer.megatron.expert_model_parallel_size == 2
    assert not [k for k in config.inert_keys if k.key == "moe_tp_extend_ep"]  # it acts now


def test_the_colocated_rollout_spreads_experts_over_every_engine_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # enable_expert_parallel with 16 colocated TP1 engines: vLLM's EP = TP x DP = 16 workers.
    code, out, err = _check(capsys, CONFIGS, "dapo_qwen3_30b_a3b_A3", "--cluster", "1x16")
    assert code == 0, err
    actors = json.loads(out)["memory_gb"]["generation_actors"]
    assert len(actors) == 16 and actors[0]["weights"] < 8  # ~61 GB of bf16 weights over 16 workers
    code, _, err = _check(
        capsys,
        CONFIGS,
        "dapo_qwen3_30b_a3b_A3",
        "--cluster",
        "1x16",
        "generate_config.enable_expert_parallel=false",
    )
    assert code == 2 and "generation actor 0" in err


@pytest.mark.parametrize("name", sorted(OVER_MEMORY))
def test_shipped_recipe_over_its_device_memory_names_the_rank(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    cluster, phrase = OVER_MEMORY[name]
    code, _, err = _check(capsys, CONFIGS, name)
    assert code == 0, err
    code, out, err = _check(capsys, CONFIGS, name, "--cluster", cluster)
    assert code == 2 and phrase in err, err
    # The distributed optimizer is already on (DP 1): the hint names DP and the swap optimizer.
    assert "over 1 data-parallel rank(s) (world 16 / (TP 4 x PP 4))" in err
    assert "use_distributed_optimizer: true" not in err
    fixed = _check(capsys, CONFIGS, name, "--cluster", cluster, "megatron_training.swap_optimizer=true")
    assert fixed[0] == 0, fixed[2]
    stages = json.loads(out)["memory_gb"]["trainer_ranks"]
    # Per-stage memory follows the uneven split: 16, 17, 16, 15 layers, 4 ranks (TP4) per stage.
    params = [stages[4 * s]["parameters"] for s in range(4)]
    assert params[1] > params[2]  # 17 layers against 16, neither with the embedding or output layer
    assert params[0] > params[2] and params[3] > params[2]  # + the embedding / + the output layer


def test_noop_layers_hold_no_weights_and_split_the_real_layers() -> None:
    # upstream's Qwen3-235B: num_layers 96 = 94 + noop layers 5 and 95, PP16 of 6 positions each.
    plan = build_run_plan(load_config_from_files(CONFIGS, "grpo_qwen3_235b_a22b_A2"))
    layout = plan.trainer.megatron
    assert layout is not None and layout.stage_layers == (5,) + (6,) * 14 + (5,)
    assert plan.memory is not None and plan.memory.trainer.shape.num_layers == 94


@pytest.mark.parametrize(
    ("name", "cluster"), [("dapo_qwen25_32b_A2_20k", "8x8"), ("dapo_qwen25_32b_A3_32k", "4x16")]
)
def test_long_context_recipes_plan_per_rank_memory_with_context_parallelism(
    capsys: pytest.CaptureFixture[str], name: str, cluster: str
) -> None:
    plan = build_run_plan(load_config_from_files(CONFIGS, name))
    layout = plan.trainer.megatron
    assert layout is not None
    assert (layout.context_parallel_size, layout.context_parallel_algo) == (2, "megatron_cp_algo")
    assert layout.data_parallel_size(64) == 2  # TP8 x PP2 x CP2 = 32 ranks per replica
    code, out, err = _check(capsys, CONFIGS, name, "--cluster", cluster)
    assert code == 0, err
    memory = json.loads(out)["memory_gb"]
    seq = memory["context_parallel"]["seq_length"]
    assert memory["context_parallel"] == {"size": 2, "tokens_per_rank": seq // 2, "seq_length": seq}
    # The same recipe without CP: each rank holds the whole sequence. Rank 0 (first pipeline stage:
    # no logits, flash attention so no s^2 term) keeps exactly twice the activations (to the 0.01 GB
    # rounding of the report).
    code, out, err = _check(
        capsys, CONFIGS, name, "--cluster", cluster, "actor_config.context_parallel_size=1"
    )
    whole = json.loads(out)["memory_gb"]
    assert "context_parallel" not in whole
    with_cp, without = memory["trainer_ranks"][0]["activations"], whole["trainer_ranks"][0]["activations"]
    assert without == pytest.approx(2 * with_cp, abs=0.02)
