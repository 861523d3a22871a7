#!/usr/bin/env bash
# The ASP pipeline on a laptop CPU with the tiny model (what `make demo` runs). No cluster needed:
# train_grpo.py starts a local Ray instance with fractional CPU requests when none is running.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_bin="${PYTHON:-${repo_root}/.venv/bin/python}"
cd "${repo_root}"
exec "${python_bin}" cli/train_grpo.py --config-name grpo_tiny_asp "$@"
