#!/usr/bin/env bash
# Start (or join) a Ray cluster with token authentication on, and run one config on it.
#
#   head node:         NNODES=2 NPUS_PER_NODE=16 bash examples/ray_launch.sh <config-name> [hydra overrides...]
#   each other node:   RAY_HEAD=<head-ip>:6379 NPUS_PER_NODE=16 bash examples/ray_launch.sh --worker
#   a running cluster: RAY_ADDRESS=<ip>:<port> bash examples/ray_launch.sh <config-name> [...]
#                      (joins it with its token; starts and stops no Ray process)
#   check mode:        NNODES=8 NPUS_PER_NODE=8 bash examples/ray_launch.sh <config-name> --dry-run [...]
#                      (no run: the placement dry run on a fake NNODES x NPUS_PER_NODE cluster, or with
#                      RAY_ADDRESS on that cluster: where each actor lands and, with role environments,
#                      the interpreter each starts in; a missing environment is refused by name)
#
# Role environments (async pipeline): TRAINER_ENV and ROLLOUT_ENV name two environment folders (a venv
# or conda env with bin/python; the same path on every node), e.g. the Ascend trainer set (MindSpeed,
# megatron-core 0.12.1, torch 2.7.1) and the rollout set (vllm-ascend), which no single environment
# can hold. `make setup-npu` builds them on a node (stacks/setup_role_envs.sh); stacks/Dockerfile.ascend
# bakes them into an image. With them, every node this script starts (head and --worker) checks its
# own copies first and stops naming the missing environment or package; Ray and the driver run from
# TRAINER_ENV's interpreter unless PYTHON is set; and the run gets async_config.role_envs.
#
# Token: every Ray process this starts, the wait for nodes and the driver run with RAY_AUTH_MODE=token
# and RAY_AUTH_TOKEN_PATH=<token file>: $RAY_AUTH_TOKEN_PATH if set, else Ray's ~/.ray/auth_token.
# The head writes a new token there (mode 0600) when there is none; a worker or a RAY_ADDRESS run
# needs a copy of the head's file (or RAY_AUTH_TOKEN=<token>) and stops with the fix when it has none.
#
# Stopping: the head runs as `ray start --head --block` in the background, and when this script
# ends (the run finished or failed, Ctrl-C, SIGTERM) that process gets SIGTERM, which stops exactly
# the Ray processes it started. Nothing else is stopped: no `ray stop`, no pkill, so other users'
# Ray clusters and Python processes on the node are left alone. A worker stops when its
# `ray start --block` is ended (Ctrl-C or kill -TERM <pid>).
#
# Other settings (environment): RAY_PORT (6379); RAY_TEMP_DIR (the head's session files, default
# /tmp/ray_launch_<uid>_<port>, a folder of its own so that another cluster's `ray_current_cluster`
# is never read or overwritten); RAY_NODE_IP (--node-ip-address; default: Ray's choice);
# RAY_HEAD_ARGS / RAY_WORKER_ARGS (more `ray start` flags, e.g. --dashboard-port=8260);
# TRAIN_ENTRY (cli/train_grpo.py; the DAPO scripts use cli/train_dapo.py); CONFIG_DIR (a folder
# of run YAMLs instead of configs/); LOG_DIR (runs/logs); RAY_WAIT_TIMEOUT_S (3000: how long the
# head waits for the NNODES nodes).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer_env="${TRAINER_ENV:-}"
rollout_env="${ROLLOUT_ENV:-}"
default_python="${repo_root}/.venv/bin/python"
[[ -n "${trainer_env}" ]] && default_python="${trainer_env}/bin/python"
python_bin="${PYTHON:-${default_python}}"
[[ -x "${python_bin}" ]] || python_bin="python3"
ray_bin="$(dirname "${python_bin}")/ray"
[[ -x "${ray_bin}" ]] || ray_bin="ray"
port="${RAY_PORT:-6379}"
npus="${NPUS_PER_NODE:-0}"
resources="{\"NPU\": ${npus}}"
node_ip_args=()
[[ -n "${RAY_NODE_IP:-}" ]] && node_ip_args=(--node-ip-address="${RAY_NODE_IP}")
cd "${repo_root}"

say() { echo "ray_launch: $*" >&2; }
die() { say "error: $*"; exit 2; }

mode="head"
if [[ "${1:-}" == "--worker" ]]; then
  mode="worker"
elif [[ -n "${RAY_ADDRESS:-}" ]]; then
  mode="join"
fi

# --dry-run anywhere after the config name: check mode (see the top of this file).
dry_run=0
args=()
for arg in "$@"; do
  if [[ "${arg}" == "--dry-run" ]]; then dry_run=1; else args+=("${arg}"); fi
done
set -- "${args[@]+"${args[@]}"}"

# This node's copies of the role environments, before any Ray process starts here (check mode: the
# dry run probes them itself, reporting the device stacks a laptop lacks instead of refusing them).
role_overrides=()
if [[ -n "${trainer_env}" || -n "${rollout_env}" ]]; then
  [[ -n "${trainer_env}" && -n "${rollout_env}" ]] \
    || die "set both TRAINER_ENV and ROLLOUT_ENV (the two role environments), or neither"
  device="cpu"
  [[ "${npus}" != "0" ]] && device="npu"
  for role in trainer rollout; do
    env_dir="${trainer_env}"
    [[ "${role}" == "rollout" ]] && env_dir="${rollout_env}"
    [[ -x "${env_dir}/bin/python" ]] \
      || die "the ${role} environment ${env_dir} has no bin/python on this node ($(hostname)); build it here with make setup-npu (stacks/setup_role_envs.sh) or fix ${role^^}_ENV"
    role_overrides+=("++async_config.role_envs.${role}.python=${env_dir}/bin/python")
    if [[ "${dry_run}" == "0" ]]; then
      "${python_bin}" -m mindspeed_rl.utils.role_env_check node --role "${role}" \
        --python "${env_dir}/bin/python" --device "${device}" || exit 2
    fi
  done
fi

# Token authentication stays on for every process below (the cluster's only lock); check mode on a
# fake cluster starts no cluster anyone else joins, so it needs no token.
if [[ "${dry_run}" == "0" || "${mode}" != "head" ]]; then
  if [[ -n "${RAY_AUTH_MODE:-}" && "${RAY_AUTH_MODE}" != "token" ]]; then
    die "RAY_AUTH_MODE=${RAY_AUTH_MODE}: this launcher keeps Ray's token authentication on; unset RAY_AUTH_MODE"
  fi
  export RAY_AUTH_MODE=token
  if [[ -z "${RAY_AUTH_TOKEN:-}" ]]; then
    create=()
    [[ "${mode}" == "head" ]] && create=(--create)
    RAY_AUTH_TOKEN_PATH="$("${python_bin}" -m mindspeed_rl.utils.ray_auth token-file "${create[@]}")" || exit 2
    export RAY_AUTH_TOKEN_PATH
    token_note="token file ${RAY_AUTH_TOKEN_PATH}"
  else
    token_note="token from \$RAY_AUTH_TOKEN"
  fi
  # No SIGTERM drain of the node (Ray waits up to 30 s for Serve proxies; a training run has none).
  export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}"
fi

if [[ "${mode}" == "worker" ]]; then
  : "${RAY_HEAD:?set RAY_HEAD=<head-ip>:${port}}"
  say "joining ${RAY_HEAD} with token authentication (${token_note})"
  # shellcheck disable=SC2086  # RAY_WORKER_ARGS is a list of flags
  exec "${ray_bin}" start --address="${RAY_HEAD}" --resources="${resources}" "${node_ip_args[@]}" \
    ${RAY_WORKER_ARGS:-} --block
fi

config_name="${1:?usage: $0 <config-name> [--dry-run] [overrides...] | --worker}"
shift
nnodes="${NNODES:-1}"
entry="${TRAIN_ENTRY:-cli/train_grpo.py}"
config_dir_args=()
[[ -n "${CONFIG_DIR:-}" ]] && config_dir_args=(--config-dir "${CONFIG_DIR}")

if [[ "${dry_run}" == "1" ]]; then
  fake=(--fake-cluster "${nnodes}x${npus}")
  where="a fake ${nnodes}x${npus} cluster"
  if [[ "${mode}" == "join" ]]; then
    fake=()
    where="the cluster at ${RAY_ADDRESS}"
  fi
  say "check mode: placement dry run of ${config_name} on ${where}"
  exec "${python_bin}" cli/check_config.py "${config_dir_args[@]}" --config-name "${config_name}" \
    --placement-dry-run "${fake[@]}" "${role_overrides[@]}" "$@"
fi
head_pid=""
driver_pid=""

# Ends a process this script started: SIGTERM, up to $2 s, then SIGKILL.
stop_pid() {
  local pid="$1" grace="$2" what="$3"
  kill -0 "${pid}" 2>/dev/null || return 0
  say "stopping ${what} (pid ${pid})"
  kill -TERM "${pid}" 2>/dev/null || true
  for _ in $(seq 1 "${grace}"); do
    kill -0 "${pid}" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "${pid}" 2>/dev/null; then
    say "${what} did not stop in ${grace} s; sending SIGKILL to pid ${pid}"
    kill -KILL "${pid}" 2>/dev/null || true
  fi
  wait "${pid}" 2>/dev/null || true
}

# On every exit: the driver first (when a signal ended this script before it), then our own head.
cleanup() {
  [[ -n "${driver_pid}" ]] && stop_pid "${driver_pid}" 30 "the driver ${entry}"
  [[ -n "${head_pid}" ]] && stop_pid "${head_pid}" 60 "the Ray head this script started"
  driver_pid="" head_pid=""
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ "${mode}" == "join" ]]; then
  address="${RAY_ADDRESS}"
  say "running on the Ray cluster at ${address} (${token_note}); it is not stopped afterwards"
else
  temp_dir="${RAY_TEMP_DIR:-/tmp/ray_launch_$(id -u)_${port}}"
  if "${python_bin}" -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' \
    "${port}" 2>/dev/null; then
    die "port ${port} is in use on this node (another Ray cluster?); set RAY_PORT to a free port, or RAY_ADDRESS=<ip>:${port} to run on that cluster"
  fi
  mkdir -p "${temp_dir}"
  rm -f "${temp_dir}/ray_current_cluster" # this folder is ours alone: a leftover is from our own last run
  say "starting a Ray head on port ${port} with token authentication (${token_note}); session files in ${temp_dir}"
  # shellcheck disable=SC2086  # RAY_HEAD_ARGS is a list of flags
  "${ray_bin}" start --head --port="${port}" --temp-dir="${temp_dir}" --resources="${resources}" \
    "${node_ip_args[@]}" ${RAY_HEAD_ARGS:-} --block &
  head_pid=$!
  for _ in $(seq 1 240); do
    [[ -s "${temp_dir}/ray_current_cluster" ]] && break
    kill -0 "${head_pid}" 2>/dev/null || die "ray start --head exited; see its output above"
    sleep 0.5
  done
  [[ -s "${temp_dir}/ray_current_cluster" ]] || die "the Ray head did not come up in 120 s"
  address="$(cat "${temp_dir}/ray_current_cluster")"
  say "Ray head ${address} (pid ${head_pid}); other nodes join with:"
  say "  RAY_HEAD=${address} NPUS_PER_NODE=${npus} bash examples/ray_launch.sh --worker   (with a copy of the token file)"
fi

"${python_bin}" -m mindspeed_rl.utils.ray_setup wait-nodes "${address}" "${nnodes}" \
  --timeout "${RAY_WAIT_TIMEOUT_S:-3000}" || exit 2

log_dir="${LOG_DIR:-${repo_root}/runs/logs}"
mkdir -p "${log_dir}"
log="${log_dir}/${config_name}_$(date +%Y%m%d-%H%M%S).log"
# The driver runs in the background so that a SIGTERM or Ctrl-C to this script is acted on at once
# (bash runs traps only between commands, and `wait` is one it leaves for a signal). It never
# touches a device: TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps torch (which the driver imports for a
# learned length predictor or a model it builds) from loading torch_npu in an environment that has it.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 RAY_ADDRESS="${address}" "${python_bin}" "${entry}" "${config_dir_args[@]}" --config-name "${config_name}" \
  "${role_overrides[@]}" "$@" > >(tee "${log}") 2>&1 &
driver_pid=$!
set +e
wait "${driver_pid}"
status=$?
set -e
driver_pid=""
say "${entry} exited with ${status} (log: ${log})"
exit "${status}"
