"""cli/check_config.py on an upstream-style GRPO YAML written the way upstream users write it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import check_config

REPO = Path(__file__).resolve().parents[2]

# Upstream's sections, keys and `defaults` form, with its own model file (not one of ours).
UPSTREAM_RUN = """\
defaults:
  - model:
      - mini_qwen

megatron_training:
  model: mini_qwen
  use_fused_rmsnorm: true
  use_mcore_models: true
  sequence_parallel: true
  use_flash_attn: true
  bf16: true
  use_distributed_optimizer: true
  tokenizer_type: PretrainedFromHF
  tokenizer_name_or_path: ./Mini-Qwen
  global_batch_size: 8
  seq_length: 1024
  save_interval: 100
  train_iters: 50
  stage: ray_grpo
  distributed_backend: nccl
  dataset_additional_keys: ['labels']
  data_path: ./dataset/mini/data
  split: 100,0,0
  no_shuffle: false
  seed: 1

actor_config:
  micro_batch_size: 4
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  lr: 1e-6
  lr_decay_style: constant
  min_lr: 0
  weight_decay: 0.01
  clip_grad: 1.0
  adam_beta1: 0.9
  adam_beta2: 0.95
  finetune: true
  load: ./ckpt
  save: ./ckpt
  no_load_optim: true
  no_load_rng: true

ref_config:
  tensor_model_parallel_size: 2

rl_config:
  use_integrated_worker: true
  blocking: true
  gamma: 1.0
  lam: 0.95
  actor_forward_micro_batch_size: 8
  ref_forward_micro_batch_size: 8
  adv_estimator: group_norm
  kl_penalty: low_var_kl
  kl_ctrl_type: fixed
  init_kl_coef: 0.001
  mini_batch_size: 4
  max_prompt_length: 512
  epochs: 1
  clip_ratio: 0.2
  entropy_coeff: 0.0
  shuffle_mini_batch: false
  n_samples_per_prompt: 8
  rule_reward: true
  verifier_function: ["base_acc"]
  verifier_weight: [1.0]
  use_tensorboard: true
  actor_resource:
    num_npus: 8

generate_config:
  trust_remote_code: true
  offload_train_optimizer: true
  offload_train_grad: true
  offload_train_param: true
  infer_tensor_parallel_size: 2
  infer_pipeline_parallel_size: 1
  infer_expert_parallel_size: 1
  max_num_seqs: 256
  max_model_len: 2048
  max_num_batched_tokens: 4096
  dtype: "bfloat16"
  gpu_memory_utilization: 0.4
  sampling_config:
    logprobs: 1
    max_tokens: 1024
    top_p: 1.0
    top_k: -1
    min_p: 0.0
    temperature: 1.0
    detokenize: false

profiler_config:
  integrated:
    profile: false
    stage: all

msprobe_config:
  msprobe: false
"""

UPSTREAM_MODEL = """\
mini_qwen:
  use_mcore_models: true
  num_layers: 4
  hidden_size: 256
  ffn_hidden_size: 512
  num_attention_heads: 8
  group_query_attention: true
  num_query_groups: 2
  rotary_base: 1000000
  max_position_embeddings: 4096
  padded_vocab_size: 1024
  make_vocab_size_divisible_by: 1
  untie_embeddings_and_output_weights: true
  add_qkv_bias: true
  disable_bias_linear: true
  normalization: RMSNorm
  norm_epsilon: 1e-6
  swiglu: true
  position_embedding_type: rope
"""


@pytest.fixture
def upstream_dir(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mini_qwen.yaml").write_text(UPSTREAM_MODEL)
    (tmp_path / "grpo_mini_A3.yaml").write_text(UPSTREAM_RUN)
    return tmp_path


def test_upstream_style_yaml_passes_and_prints_the_resolved_config(
    upstream_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = check_config.main(["--config-dir", str(upstream_dir), "--config-name", "grpo_mini_A3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    resolved = json.loads(out)
    assert resolved["rl_config"]["pipeline"] == "hybrid"
    assert resolved["actor_config"]["lr"] == 1e-6 and resolved["actor_config"]["num_layers"] == 4
    assert resolved["ref_config"]["tensor_model_parallel_size"] == 2
    assert resolved["model"]["mini_qwen"]["hidden_size"] == 256
    assert "megatron_training.distributed_backend" in err  # inert keys are reported, not dropped


def test_one_misspelt_key_fails_and_names_the_correct_key(
    upstream_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = upstream_dir / "grpo_mini_A3.yaml"
    run.write_text(run.read_text().replace("  init_kl_coef: 0.001", "  init_kl_coeff: 0.001"))
    code = check_config.main(["--config-dir", str(upstream_dir), "--config-name", "grpo_mini_A3"])
    out, err = capsys.readouterr()
    assert code != 0 and out == ""
    assert "rl_config: unknown key 'init_kl_coeff'; did you mean 'init_kl_coef'?" in err
    assert "Traceback" not in err


def test_overrides_and_list_inert(upstream_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config-dir", str(upstream_dir), "--config-name", "grpo_mini_A3", "--list-inert"]
    # The Training Unit on NPUs, where the megatron engine can build sequence parallelism and flash
    # attention (the YAML asks for both; on CPU the plan refuses them).
    queue = [
        "+async_config.queue_max_samples=128", "+async_config.queue_resume_samples=64",
        "+async_config.trainer_resources.num_npus=8",
    ]  # fmt: skip
    # asp's default minibatches (32 + 2 prompts) could deadlock with lag 4 x 8 prompts per batch:
    # the Control Unit would refuse them at run start, so the check does too.
    minibatch = ["+asp_config.b=8", "+asp_config.kappa=0"]
    assert check_config.main([*args, "+rl_config.pipeline=async", *queue]) == 2
    assert "a minibatch of 34 prompts cannot always be admitted" in capsys.readouterr().err
    assert check_config.main([*args, "+rl_config.pipeline=async", *queue, *minibatch]) == 0
    lines = capsys.readouterr().out.splitlines()
    # use_mcore_models: true selects the megatron engine, which reads the actor's layout; the
    # reference shares it, and other megatron-only switches stay inert.
    assert not any(line.startswith("actor_config.tensor_model_parallel_size: ") for line in lines)
    assert any(line.startswith("ref_config.tensor_model_parallel_size: ") for line in lines)
    assert any(".distributed_backend: " in line for line in lines)
    assert any(line.startswith("generate_config.infer_tensor_parallel_size: ") for line in lines)  # async
    assert all(": " in line for line in lines)


def test_a_units_error_exits_nonzero(upstream_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config-dir", str(upstream_dir), "--config-name", "grpo_mini_A3", "rl_config.mini_batch_size=3"]
    assert check_config.main(args) == 2
    assert "3 prompts per optimizer step must divide" in capsys.readouterr().err


def test_missing_config_name_suggests_the_nearest(
    upstream_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_config.main(["--config-dir", str(upstream_dir), "--config-name", "grpo_mini_A2"]) == 2
    assert "did you mean 'grpo_mini_A3'?" in capsys.readouterr().err


def test_script_runs_as_a_command_with_the_repo_configs_by_default() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, str(REPO / "cli" / "check_config.py"), "--config-name", "grpo_tiny_cpu"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["megatron_training"]["data_path"] == "builtin:demo"
    bad = subprocess.run(
        [sys.executable, str(REPO / "cli" / "check_config.py"), "--config-name", "grpo_tiny_cpu", "rl_config.epochs=x"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "rl_config.epochs: expected an integer" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_check_fails_like_the_control_unit_on_equal_queue_levels(capsys: pytest.CaptureFixture[str]) -> None:
    from mindspeed_rl.runtime.config import RuntimeConfig

    overrides = ["async_config.gu_queue_low=4", "async_config.gu_queue_high=4"]
    assert check_config.main(["--config-name", "grpo_tiny_asp", *overrides]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ValueError) as run_error:
        RuntimeConfig(num_prompts_per_global_batch=32, num_samples_per_prompt=8, queue_max_samples=512,
                      queue_resume_samples=256, gu_queue_low=4, gu_queue_high=4)  # fmt: skip
    assert str(run_error.value) in err


def test_unsupported_keys_are_errors_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "rl_config.kl_ctrl_type=adaptive": "rl_config.kl_target and rl_config.kl_horizon",
        "async_config.bucket_mb=0": "async_config.bucket_mb=0.0; use a positive size in MB",
    }
    for override, expected in cases.items():
        name = "grpo_tiny_asp" if "async" in override else "grpo_tiny_cpu"
        assert check_config.main(["--config-name", name, override]) == 2, override
        assert expected in capsys.readouterr().err


def test_bf16_is_honoured_not_inert_and_fit_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        check_config.main(["--config-name", "grpo_tiny_cpu", "megatron_training.bf16=true", "--list-inert"])
        == 0
    )
    assert "bf16" not in capsys.readouterr().out
    assert check_config.main(["--config-name", "grpo_tiny_asp", "--available", "CPU=0.5"]) == 2
    assert "actors need" in capsys.readouterr().err
    assert check_config.main(["--config-name", "grpo_tiny_asp", "--available", "CPU=2"]) == 0


def test_cluster_prints_where_every_rank_and_actor_goes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config.main(["--config-name", "grpo_qwen3_30b_a3b_asp_A3", "--cluster", "8x8"]) == 0
    placement = json.loads(capsys.readouterr().out)
    assert placement["device_kind"] == "NPU" and "num_npus" in placement["device_kind_from"]
    assert placement["devices_used"] == 64 and len(placement["nodes"]) == 8
    assert len(placement["trainer_ranks"]) == 32 and placement["trainer_ranks"][31] == {
        "rank": 31, "node": 3, "devices": [7], "cpus": 4.0
    }  # fmt: skip
    actors = placement["generation_actors"]
    assert len(actors) == 16 and actors[-1] == {
        "gu": 3,
        "actor": 3,
        "node": 7,
        "devices": [6, 7],
        "cpus": 8.0,
    }


def test_cluster_too_small_exits_2_naming_the_shortfall(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config.main(["--config-name", "grpo_qwen3_30b_a3b_asp_A3", "--cluster", "4x8"]) == 2
    out, err = capsys.readouterr()
    assert (
        out == "" and "need 64 NPUs on nodes of 8; the cluster has 4 nodes x 8 = 32 NPUs: short by 32" in err
    )
    assert check_config.main(["--config-name", "grpo_qwen25_7b_A3", "--cluster", "2x8"]) == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert {r["node"] for r in hybrid["trainer_ranks"]} == {0, 1} and hybrid["colocated"]
    with pytest.raises(SystemExit):
        check_config.main(["--config-name", "grpo_tiny_cpu", "--cluster", "eight"])
    assert "write NODESxDEVICES" in capsys.readouterr().err
