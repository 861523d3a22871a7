#!/usr/bin/env bash
# Builds the async pipeline's two role environments on this node (run it on every node, or bake
# them into an image: stacks/Dockerfile.ascend), from the sets the resolver checks (make check-stacks):
#
#   bash stacks/setup_role_envs.sh [--stack ascend|gpu] [--prefix DIR] [--python PYTHON] [--role trainer|rollout]
#   make setup-npu                   # = --stack ascend --prefix $(ENVS)
#
#   <prefix>/trainer   stacks/<stack>-trainer.txt  + what the driver and the Control Unit need (they run
#                      here too: Ray and the driver start from this interpreter) + this checkout
#   <prefix>/rollout   stacks/<stack>-rollout.txt  + Ray and the weight-flow libraries + this checkout
#
# Then run with TRAINER_ENV=<prefix>/trainer ROLLOUT_ENV=<prefix>/rollout (examples/ray_launch.sh).
# The prefix must be the same path on every node (default: <this checkout>/.envs).
#
# Packages PyPI does not serve are installed from checkouts you name, before the set (the stack
# files' headers say where each comes from and how it is built):
#   MINDSPEED_SRC=<MindSpeed checkout, branch 26.1.0_core_r0.12.1>   (trainer)
#   VLLM_SRC=<vLLM checkout at the tag vllm-ascend pins>               (rollout; VLLM_TARGET_DEVICE=empty)
#   VLLM_ASCEND_SRC=<vllm-ascend checkout>                            (rollout)
# PIP_ARGS: more pip flags for every install (e.g. --extra-index-url https://download.pytorch.org/whl/cpu
# for torch-npu's +cpu torch on x86_64, or a mirror). Nothing is run as root and nothing outside the
# prefix is changed. The last step checks each environment from the trainer's interpreter and stops
# naming any module its role lacks.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stack="ascend"
prefix="${repo_root}/.envs"
python="python3"
roles=(trainer rollout)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stack) stack="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --role) roles=("$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "setup_role_envs: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "setup_role_envs: $*" >&2; }
die() { say "error: $*"; exit 2; }

case "${stack}" in
  ascend) device="npu" ;;
  gpu) device="cuda" ;;
  *) die "--stack ${stack}: use ascend or gpu" ;;
esac
command -v "${python}" > /dev/null || die "no ${python} on this node; pass --python <a Python 3.11 interpreter>"
read -r -a pip_args <<< "${PIP_ARGS:-}"

# The project's own runtime needs, by name (the stack file's pins win) except Ray: every process
# of a cluster runs one Ray version, so it is pinned as mindspeed_rl/_pins.py pins it.
pins() { "${python}" -c 'import runpy, sys; p = runpy.run_path(sys.argv[1]); print(" ".join(p[sys.argv[2]]))' \
  "${repo_root}/mindspeed_rl/_pins.py" "$1"; }
ray_pin="$(pins RUNTIME | tr ' ' '\n' | grep '^ray==')"
names() { for spec in "$@"; do echo "${spec%%[=<>!~]*}"; done; }
# pyarrow is left to the set: Ray imports it in every worker when installed, and PyPI's newest
# needs numpy 2 (fatal in a numpy-1.26 trainer set); the driver reads parquet prompts with it.
# shellcheck disable=SC2207  # plain package names, no spaces
runtime=($(names $(pins RUNTIME) | grep -v -e '^ray$' -e '^pyarrow$'))
# shellcheck disable=SC2207
core=($(names $(pins CORE)))

for role in "${roles[@]}"; do
  [[ "${role}" == trainer || "${role}" == rollout ]] || die "--role ${role}: use trainer or rollout"
  set_file="${repo_root}/stacks/${stack}-${role}.txt"
  [[ -f "${set_file}" ]] || die "${set_file} is missing (the ${stack} ${role} set that make check-stacks resolves)"
  env_dir="${prefix}/${role}"
  say "${role}: ${env_dir} from ${set_file}"
  [[ -x "${env_dir}/bin/python" ]] || "${python}" -m venv "${env_dir}"
  pip=("${env_dir}/bin/python" -m pip)
  "${pip[@]}" install -q --upgrade pip
  if [[ "${role}" == trainer && -n "${MINDSPEED_SRC:-}" ]]; then
    "${pip[@]}" install "${pip_args[@]}" --no-deps -e "${MINDSPEED_SRC}"
  fi
  if [[ "${role}" == rollout && -n "${VLLM_SRC:-}" ]]; then
    VLLM_TARGET_DEVICE=empty "${pip[@]}" install "${pip_args[@]}" -e "${VLLM_SRC}"
  fi
  if [[ "${role}" == rollout && -n "${VLLM_ASCEND_SRC:-}" ]]; then
    "${pip[@]}" install "${pip_args[@]}" -e "${VLLM_ASCEND_SRC}"
  fi
  "${pip[@]}" install "${pip_args[@]}" -r "${set_file}"
  if [[ "${role}" == trainer ]]; then
    # The driver and the Control Unit run here too (they import no engine stack).
    "${pip[@]}" install "${pip_args[@]}" -c "${set_file}" "${ray_pin}" "${core[@]}" "${runtime[@]}"
  else
    "${pip[@]}" install "${pip_args[@]}" -c "${set_file}" "${ray_pin}" safetensors PyYAML psutil math-verify
  fi
  # This checkout, without its own pins (the set's numpy, torch and transformers stay).
  "${pip[@]}" install -q --no-deps -e "${repo_root}"
done

# Each environment as the launcher checks it on every node, from the trainer's interpreter (the one
# Ray and the driver start from): its role's modules, Python and Ray versions, snapshot format.
base="${prefix}/trainer/bin/python"
[[ -x "${base}" ]] || die "${base} is missing: build the trainer environment first (--role trainer)"
for role in "${roles[@]}"; do
  "${base}" -m mindspeed_rl.utils.role_env_check node --role "${role}" --python "${prefix}/${role}/bin/python" \
    --device "${device}" $([[ "${role}" == trainer ]] && echo --megatron) || exit 2
done
say "done: TRAINER_ENV=${prefix}/trainer ROLLOUT_ENV=${prefix}/rollout"
