#!/usr/bin/env bash
# GRPO Qwen3-235B-A22B on Atlas A3: configs/grpo_qwen3_235b_a22b_A3.yaml, 16 node(s) x 16 NPUs.
#   head:  bash examples/grpo/grpo_trainer_qwen3_235b_a22b.sh [yaml] [hydra overrides...]
#   other nodes: RAY_HEAD=<head-ip>:6379 bash examples/grpo/grpo_trainer_qwen3_235b_a22b.sh --worker
#   (each with a copy of the head's Ray token file: see examples/ray_launch.sh)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../recipe_launch.sh" cli/train_grpo.py grpo_qwen3_235b_a22b_A3 16 16 "$@"
