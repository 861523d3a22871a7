#!/usr/bin/env bash
# Qwen3-30B-A3B GRPO with the ASP pipeline on 8 Ascend A3 nodes x 8 NPUs (configs/grpo_qwen3_30b_a3b_asp_A3.yaml).
# Head: bash examples/grpo_qwen3_30b_asp.sh   Workers: RAY_HEAD=<head-ip>:6379 NPUS_PER_NODE=8 bash examples/ray_launch.sh --worker
# (each worker with a copy of the head's Ray token file, ~/.ray/auth_token: see examples/ray_launch.sh)
#
# On Ascend the trainer (MindSpeed, megatron-core 0.12.1, torch 2.7.1, numpy <= 1.26) and the rollout
# (vllm-ascend and the vLLM and torch it needs) cannot share one Python environment, so each role gets
# its own, at the same path on every node (build them with `make setup-npu`, or use the image of
# stacks/Dockerfile.ascend), and every node, head and workers, is started with both named:
#   TRAINER_ENV=/opt/mindspeed-rl/envs/trainer ROLLOUT_ENV=/opt/mindspeed-rl/envs/rollout bash examples/grpo_qwen3_30b_asp.sh
# Check first, without NPUs or a cluster (a fake 8x8 Ray cluster on this machine; where each actor
# lands and which environment it starts in; a missing environment is refused by name):
#   TRAINER_ENV=... ROLLOUT_ENV=... bash examples/grpo_qwen3_30b_asp.sh --dry-run
NNODES="${NNODES:-8}" NPUS_PER_NODE="${NPUS_PER_NODE:-8}" exec bash "$(dirname "$0")/ray_launch.sh" grpo_qwen3_30b_a3b_asp_A3 "$@"
