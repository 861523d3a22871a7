#!/usr/bin/env bash
# DAPO Qwen3-30B-A3B on Atlas A3: configs/dapo_qwen3_30b_a3b_A3.yaml, 1 node(s) x 16 NPUs.
#   head:  bash examples/dapo/dapo_trainer_qwen3_30b_a3b.sh [yaml] [hydra overrides...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../recipe_launch.sh" cli/train_dapo.py dapo_qwen3_30b_a3b_A3 1 16 "$@"
