#!/usr/bin/env bash
# Preprocess a prompt dataset: bash examples/data/preprocess_data.sh <deepscaler|math_17k|CONFIG.yaml> [key=value ...]
# The config lives in configs/datasets/<name>.yaml; overrides such as input=... take precedence.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <deepscaler|math_17k|path/to/config.yaml> [key=value ...]" >&2
  exit 2
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python_bin="${PYTHON:-${repo_root}/.venv/bin/python}"
if [[ ! -x "${python_bin}" ]]; then
  python_bin="python3"
fi

cd "${repo_root}"
PYTHONPATH="${repo_root}${PYTHONPATH:+:${PYTHONPATH}}" "${python_bin}" cli/preprocess_data.py "$@"
