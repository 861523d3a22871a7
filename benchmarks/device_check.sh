#!/usr/bin/env bash
# One prepared device check (issue #39): every stage of benchmarks/device_check.py on ONE CUDA GPU
# with Python 3.12, the device's own torch and transformers, no vLLM, no Ray, no network, and
# megatron-core from a wheel carried in. One JSON with every figure, under 8 minutes.
#
#   bash benchmarks/device_check.sh --prepare   # here, with network: the megatron-core wheel into .cache/device_wheels/
#   bash benchmarks/device_check.sh --dry-run   # any host: print the exact commands the device runs, check them, run none
#   bash benchmarks/device_check.sh             # on the GPU: install the wheel (no index), run the stages
#   bash benchmarks/device_check.sh -- --stages env,offload    # anything after -- goes to device_check.py
#
# Environment: PYTHON (default python3: on the device, the one that holds torch), OUT (where the
# JSON and the log go; the device tool sets it; default runs/device_check), DEVICE_CHECK_WORK
# (scratch for the model and the checkpoints, several GB; default /tmp/device_check_work),
# DEVICE_CHECK_WHEELS (the wheel folder; default .cache/device_wheels), DEVICE_CHECK_LIMIT_S (the
# runner's wall-clock limit, default 465; the stages' budget is 25 s under it).
# The wheel's version is EXTRAS["megatron"] in mindspeed_rl/_pins.py; .cache/ is git-ignored, so
# the wheel is never committed: the device tool takes it along when its call names
# .cache/device_wheels in `carry`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODE=run
EXTRA=()
while (($#)); do
    case "$1" in
        --prepare) MODE=prepare ;;
        --dry-run) MODE=dry ;;
        --) shift; EXTRA=("$@"); break ;;
        -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "device_check.sh: unknown argument '$1' (use --prepare, --dry-run, or -- ARGS for device_check.py)" >&2; exit 2 ;;
    esac
    shift
done

PYTHON=${PYTHON:-python3}
WHEELS=${DEVICE_CHECK_WHEELS:-.cache/device_wheels}
SITE=.cache/device_site
OUT_DIR=${OUT:-runs/device_check}
WORK=${DEVICE_CHECK_WORK:-/tmp/device_check_work}
LIMIT_S=${DEVICE_CHECK_LIMIT_S:-465}   # the stages' runner, killed past it: with the install, under 8 minutes
BUDGET_S=$((LIMIT_S - 25))            # device_check.py starts no stage past it, and cuts the last one's timeout to fit
MAX_WHEEL_BYTES=$((16 * 1024 * 1024))   # the device tool carries 64 MiB in all; this wheel is ~2.4 MB

show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
# The commands the device runs go through here: shown always, run unless --dry-run.
step() { show "$@"; if [[ $MODE != dry ]]; then "$@"; fi; }
fail() { echo "device_check.sh: $*" >&2; exit 1; }

PIN=$("$PYTHON" -c 'import runpy; print(runpy.run_path("mindspeed_rl/_pins.py")["EXTRAS"]["megatron"][0])')
[[ $PIN == megatron-core==* ]] || fail "EXTRAS['megatron'][0] in mindspeed_rl/_pins.py is '$PIN', not megatron-core==VERSION"
VERSION=${PIN#megatron-core==}
WHEEL_GLOB="$WHEELS/megatron_core-$VERSION-cp312-*.whl"

if [[ $MODE == prepare ]]; then
    mkdir -p "$WHEELS"
    # One version only: two wheels of a package stop the install on the device.
    find "$WHEELS" -name 'megatron_core-*.whl' ! -name "megatron_core-$VERSION-*" -print -delete
    step "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" "$PIN"
    mapfile -t found < <(compgen -G "$WHEEL_GLOB" || true)
    ((${#found[@]} == 1)) || fail "expected one wheel matching $WHEEL_GLOB, found ${#found[@]}"
    size=$(stat -c %s "${found[0]}")
    ((size < MAX_WHEEL_BYTES)) || fail "${found[0]} is $size bytes, over the $MAX_WHEEL_BYTES this check allows"
    if git rev-parse --git-dir > /dev/null 2>&1 && ! git check-ignore -q "${found[0]}"; then
        fail "${found[0]} is not git-ignored: add .cache/ to .gitignore before anything else (never commit a wheel)"
    fi
    echo "prepared: ${found[0]} ($size bytes, git-ignored)"
    echo "next, on the GPU (device tool): command 'bash benchmarks/device_check.sh', carry [\"$WHEELS\"]"
    exit 0
fi

# ---- the device's commands (run, or shown by --dry-run) -------------------------------------------
mapfile -t found < <(compgen -G "$WHEEL_GLOB" || true)
if ((${#found[@]} == 1)); then
    WHEEL=${found[0]}
    size=$(stat -c %s "$WHEEL")
    ((size < MAX_WHEEL_BYTES)) || fail "$WHEEL is $size bytes, over $MAX_WHEEL_BYTES"
elif ((${#found[@]} > 1)); then
    fail "several wheels match $WHEEL_GLOB: ${found[*]}; keep one"
elif [[ $MODE == dry ]]; then
    WHEEL=$WHEEL_GLOB
    echo "note: no wheel matches $WHEEL_GLOB yet: 'bash benchmarks/device_check.sh --prepare' downloads it"
else
    fail "no wheel matches $WHEEL_GLOB: run 'bash benchmarks/device_check.sh --prepare' on a host with network, then carry $WHEELS"
fi
COMMIT=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
CHECK=(-m benchmarks.device_check --device cuda --budget-s "$BUDGET_S" --work "$WORK"
       --json "$OUT_DIR/device_check.json" --log "$OUT_DIR/device_check.log" "${EXTRA[@]}")

echo "device check: megatron-core $VERSION from $WHEEL, results in $OUT_DIR/device_check.json"
step "$PYTHON" -c 'import sys, torch
assert sys.version_info[:2] == (3, 12), f"Python {sys.version.split()[0]}: the carried wheel is cp312"
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
step rm -rf "$SITE"
step "$PYTHON" -m pip install --no-deps --no-index --no-compile --no-cache-dir --quiet --target "$SITE" "$WHEEL"
step mkdir -p "$OUT_DIR" "$WORK"
step env PYTHONPATH="$PWD/$SITE:$PWD" PYTHONUNBUFFERED=1 DEVICE_CHECK_COMMIT="$COMMIT" \
    timeout --kill-after=15 "$LIMIT_S" "$PYTHON" "${CHECK[@]}"

if [[ $MODE == dry ]]; then
    # What can be checked without the GPU: device_check.py accepts these very arguments.
    "$PYTHON" "${CHECK[@]}" --plan > /dev/null || fail "device_check.py refused the arguments above"
    echo "dry run: the commands above are what the device runs; device_check.py accepts its arguments"
fi
