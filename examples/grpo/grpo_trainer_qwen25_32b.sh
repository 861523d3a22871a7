#!/usr/bin/env bash
# GRPO Qwen2.5-32B on Atlas A3: configs/grpo_qwen25_32b_A3.yaml, 1 node(s) x 16 NPUs.
#   head:  bash examples/grpo/grpo_trainer_qwen25_32b.sh [yaml] [hydra overrides...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../recipe_launch.sh" cli/train_grpo.py grpo_qwen25_32b_A3 1 16 "$@"
