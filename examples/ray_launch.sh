#!/usr/bin/env bash
# Start (or join) a Ray cluster and run one GRPO config on it.
#
#   head node:    NNODES=8 NPUS_PER_NODE=8 bash examples/ray_launch.sh <config-name> [hydra overrides...]
#   other nodes:  RAY_HEAD=<head-ip>:6379 NPUS_PER_NODE=8 bash examples/ray_launch.sh --worker
#
# Unlike upstream's scripts this never kills other users' Python processes and never parses
# ifconfig: Ray picks the node address, and the head waits until all NNODES nodes have joined.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_bin="${PYTHON:-${repo_root}/.venv/bin/python}"
[[ -x "${python_bin}" ]] || python_bin="python3"
ray_bin="$(dirname "${python_bin}")/ray"
[[ -x "${ray_bin}" ]] || ray_bin="ray"
port="${RAY_PORT:-6379}"
npus="${NPUS_PER_NODE:-0}"
resources="{\"NPU\": ${npus}}"

if [[ "${1:-}" == "--worker" ]]; then
  : "${RAY_HEAD:?set RAY_HEAD=<head-ip>:${port}}"
  exec "${ray_bin}" start --address="${RAY_HEAD}" --resources="${resources}" --block
fi

config_name="${1:?usage: $0 <config-name> [overrides...] | --worker}"
shift
nnodes="${NNODES:-1}"
if ! "${ray_bin}" status >/dev/null 2>&1; then
  "${ray_bin}" start --head --port="${port}" --resources="${resources}"
fi
# Wait for the worker nodes (they run this script with --worker).
for _ in $(seq 1 600); do
  alive="$("${python_bin}" -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(n["Alive"] for n in ray.nodes()))')"
  [[ "${alive}" -ge "${nnodes}" ]] && break
  echo "waiting for Ray nodes: ${alive}/${nnodes}"
  sleep 5
done
mkdir -p "${repo_root}/runs/logs"
cd "${repo_root}"
"${python_bin}" cli/train_grpo.py --config-name "${config_name}" "$@" 2>&1 | tee "runs/logs/${config_name}_$(date +%Y%m%d-%H%M%S).log"
