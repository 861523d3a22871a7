"""The torch device and dtypes of a training engine, from the names the run plan carries.

``npu`` needs ``torch_npu``, which registers the device with torch; it is imported here and only
here, when an engine is really placed on an NPU, so the package still imports on any machine.
"""

from __future__ import annotations

import importlib

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``cpu | cuda | npu`` as a torch device; raises a ValueError naming what is missing."""
    if name == "npu":
        try:
            importlib.import_module("torch_npu")
        except ImportError as error:
            raise ValueError(
                "the Training Unit was given NPUs (num_npus > 0), but torch_npu is not installed; "
                "install the torch-npu wheel matching your torch and CANN (see README: Ascend)"
            ) from error
    elif name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "the Training Unit was given GPUs (num_gpus > 0), but this torch has no usable CUDA "
                f"device (torch {torch.__version__}); install a CUDA build of torch or set num_gpus: 0"
            )
    elif name != "cpu":
        raise ValueError(f"device={name!r}; use cpu, cuda or npu")
    return torch.device(name)


def torch_dtype(name: str) -> torch.dtype:
    """``float32 | bfloat16 | float16`` as a torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]
