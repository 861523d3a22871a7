#!/usr/bin/env bash
# Qwen3-30B-A3B GRPO with the ASP pipeline on 8 Ascend A3 nodes x 8 NPUs (configs/grpo_qwen3_30b_a3b_asp_A3.yaml).
# Head: bash examples/grpo_qwen3_30b_asp.sh   Workers: RAY_HEAD=<head-ip>:6379 NPUS_PER_NODE=8 bash examples/ray_launch.sh --worker
# (each worker with a copy of the head's Ray token file, ~/.ray/auth_token: see examples/ray_launch.sh)
NNODES="${NNODES:-8}" NPUS_PER_NODE="${NPUS_PER_NODE:-8}" exec bash "$(dirname "$0")/ray_launch.sh" grpo_qwen3_30b_a3b_asp_A3 "$@"
