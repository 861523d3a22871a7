#!/usr/bin/env bash
# Shared body of examples/grpo/*.sh and examples/dapo/*.sh (upstream's script names and call shape):
#
#   bash examples/grpo/grpo_trainer_qwen3_8b.sh [yaml] [hydra overrides...]     on the head node
#   RAY_HEAD=<head-ip>:6379 bash examples/grpo/grpo_trainer_qwen3_8b.sh --worker  on each other node
#
# [yaml] is a config name in configs/ (with or without .yaml) or a path to a YAML file (its folder
# becomes the config dir, so its model/ folder beside it is found). Node count and NPUs per node
# default to the recipe's (NNODES / NPUS_PER_NODE override them); examples/ray_launch.sh does the rest.
#
# Called as: recipe_launch.sh <entry> <default-yaml> <nodes> <npus-per-node> "$@"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
entry="$1" default_yaml="$2" nodes="$3" npus="$4"
shift 4
export NPUS_PER_NODE="${NPUS_PER_NODE:-${npus}}"
if [[ "${1:-}" == "--worker" ]]; then
  exec bash "${here}/ray_launch.sh" --worker
fi
yaml="${default_yaml}"
if [[ $# -gt 0 && "$1" != *=* && "$1" != -* ]]; then
  yaml="$1"
  shift
fi
if [[ -f "${yaml}" ]]; then
  CONFIG_DIR="$(cd "$(dirname "${yaml}")" && pwd)"
  export CONFIG_DIR
  yaml="$(basename "${yaml}")"
fi
yaml="${yaml%.yaml}"
echo "Use ${yaml}" >&2
NNODES="${NNODES:-${nodes}}" TRAIN_ENTRY="${TRAIN_ENTRY:-${entry}}" exec bash "${here}/ray_launch.sh" "${yaml}" "$@"
