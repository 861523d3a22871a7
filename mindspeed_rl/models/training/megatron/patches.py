"""Every shim that lets megatron-core run on CPU over gloo, in one module.

megatron-core 0.19 assumes an accelerator in a handful of places; measured on this machine, these
are all that GPTModel (local layer spec), its DDP wrapper and the pipeline schedules need:

- ``torch.cuda.current_device`` is used as a ``device=`` argument all over the layers: on CPU it
  must answer the CPU (:func:`patch_current_device`);
- the model-parallel RNG tracker forks CUDA generator states: on CPU use the inference tracker,
  which keeps no per-device state (:func:`seed_model_parallel_rng`);
- the default causal mask is built on "cuda": pass an explicit one (:func:`causal_attention_mask`);
- the pipeline schedules, p2p code and the tied output layer of a last PP stage create small tensors with ``device="cuda"`` and call
  ``torch.cuda.synchronize``; DDP's gradient all-reduce asks ``torch.cuda.current_stream()`` for
  CUDA-graph events (:class:`CudaDeviceToCpu`, :class:`NullStream`, :func:`cpu_runtime_mode`).

On accelerators every function here is a no-op (or the plain megatron call). Importing megatron goes
through :func:`import_megatron` so that MindSpeed patches megatron first on Ascend, as it requires.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

MEGATRON_INSTALL = "pip install --ignore-requires-python megatron-core==0.19.2"


def import_megatron() -> Any:
    """``megatron.core``, with MindSpeed's adaptor imported first when torch_npu is present.

    A missing megatron-core is a ValueError naming the install line (the wheel declares
    Python >= 3.12, hence the flag on 3.11).
    """
    if importlib.util.find_spec("torch_npu") is not None:
        # MindSpeed must patch megatron before any megatron module is imported.
        importlib.import_module("mindspeed.megatron_adaptor")
    try:
        return importlib.import_module("megatron.core")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("megatron"):
            raise ValueError(
                f"the megatron training backend needs megatron-core; install it with `{MEGATRON_INSTALL}` "
                "(or `make setup`), or set megatron_training.use_mcore_models: false for the torch engine"
            ) from exc
        raise


def on_cpu() -> bool:
    return not torch.cuda.is_available()


_ORIGINAL_CURRENT_DEVICE: Callable[[], Any] = torch.cuda.current_device


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


def patch_current_device() -> None:
    """Make ``torch.cuda.current_device()`` answer the CPU device (CPU hosts only; idempotent)."""
    if on_cpu():
        torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]


def unpatch_current_device() -> None:
    torch.cuda.current_device = _ORIGINAL_CURRENT_DEVICE


def seed_model_parallel_rng(seed: int) -> None:
    """Seed megatron's TP/EP RNG tracker (after ``initialize_model_parallel``).

    On CPU the default tracker would fork CUDA generator states; the inference tracker does not,
    and ``force_reset_rng`` lets a process that already built one (tests, reference model) rebuild it.
    """
    from megatron.core import tensor_parallel

    if on_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(
            seed, inference_rng_tracker=True, force_reset_rng=True
        )
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def causal_attention_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """``[1, 1, S, S]`` bool mask, True where attention is NOT allowed (megatron's convention).

    Right padding needs nothing more: padded positions come after every real token, so under a
    causal mask they never influence one.
    """
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)[None, None]


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


class CudaDeviceToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` (or a cuda ``torch.device``) keyword arguments to the CPU, and
    makes ``Tensor.cuda()`` the identity.

    Only keyword arguments: the schedules and p2p helpers pass ``device=`` by keyword, and the
    tensors they build are shapes and flags whose placement does not matter on a CPU host.
    ``Tensor.cuda()`` is what GPTModel calls on the tied output weight of the last PP stage.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.Tensor.cuda:
            return args[0]
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)


class NullStream:
    """Stands in for ``torch.cuda.current_stream()`` on CPU: there is one stream, nothing to wait for."""

    def wait_event(self, event: object) -> None:
        return None

    def wait_stream(self, stream: object) -> None:
        return None

    def synchronize(self) -> None:
        return None


def _null_stream(device: object = None) -> NullStream:
    return NullStream()


def _no_sync(device: object = None) -> None:
    return None  # nothing is asynchronous on CPU


@contextlib.contextmanager
def cpu_runtime_mode() -> Iterator[None]:
    """Context for megatron's schedules and gradient sync on CPU; a no-op on accelerators.

    Scoped (not a global patch) so that code outside megatron still sees the real torch.cuda.
    """
    if not on_cpu():
        yield
        return
    original = (torch.cuda.synchronize, torch.cuda.current_stream)
    torch.cuda.synchronize = _no_sync
    torch.cuda.current_stream = _null_stream  # type: ignore[assignment]
    try:
        with CudaDeviceToCpu():
            yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_stream = original
