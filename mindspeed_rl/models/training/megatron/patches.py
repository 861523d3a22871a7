"""Every shim that lets megatron-core run on CPU over gloo, in one module.

megatron-core assumes an accelerator in a handful of places; measured on this machine, these
are all that GPTModel (local layer spec), its DDP wrapper and the pipeline schedules need:

- ``torch.cuda.current_device`` is used as a ``device=`` argument all over the layers: on CPU it
  must answer the CPU (:func:`patch_current_device`);
- the model-parallel RNG tracker forks CUDA generator states: on CPU use the inference tracker,
  which keeps no per-device state (:func:`seed_model_parallel_rng`);
- the default causal mask is built on "cuda": pass an explicit one (:func:`causal_attention_mask`);
- megatron-core 0.12.1's async checkpoint writer calls torch's private ``_write_item`` without the
  argument newer torch requires (:func:`adapt_dist_checkpoint_writer`, every device), and 0.19.2
  starts a manager process per rank to pass its writer threads' results
  (:func:`in_process_checkpoint_results`, every device);
- the pipeline schedules, p2p code and the tied output layer of a last PP stage create small tensors with ``device="cuda"`` and call
  ``torch.cuda.synchronize``; DDP's gradient all-reduce asks ``torch.cuda.current_stream()`` for
  CUDA-graph events (:class:`CudaDeviceToCpu`, :class:`NullStream`, :func:`cpu_runtime_mode`).

On accelerators every function here is a no-op (or the plain megatron call). Importing megatron goes
through :func:`import_megatron` so that MindSpeed patches megatron first on Ascend, as it requires,
with the engine's feature flags (:func:`mindspeed_argv`) rather than whatever ``sys.argv`` holds.

Checked against megatron-core 0.12.1 (MindSpeed's) and 0.19.2: where they differ, a shim asks
the installed version for the capability (a signature, an attribute) instead of its version.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import logging
import queue
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from mindspeed_rl.models.training.megatron.layout import DeviceKind, MegatronLayout

MEGATRON_INSTALL = "pip install --ignore-requires-python megatron-core==0.19.2"
MINDSPEED_ADAPTOR = "mindspeed.megatron_adaptor"

_log = logging.getLogger(__name__)
_mindspeed_flags: tuple[str, ...] | None = None
"""The flags this process imported MindSpeed's adaptor with (None: not imported by us)."""


def mindspeed_argv(layout: MegatronLayout) -> list[str]:
    """The command-line flags MindSpeed's adaptor must see for ``layout`` (without ``argv[0]``).

    MindSpeed (release 26.1.0_core_r0.12.1) reads its switches once, when
    ``mindspeed.megatron_adaptor`` is imported: ``patch_features()`` calls
    ``args_utils.get_mindspeed_args()``, i.e. argparse ``parse_known_args()`` over ``sys.argv``,
    and keeps the result for the process. Flags its parser does not register (``--use-flash-attn``,
    ``--sequence-parallel``, ...) are kept as unknown ``key=True`` / string values. Those args
    choose which features patch megatron (``is_need_apply``: flash attention, block recompute,
    variable-length p2p), the kernels read them at run time (``get_full_args()`` falls back to
    them while megatron.training is not initialised, as here), and its patched
    ``TransformerConfig.__init__`` merges them in as defaults under our explicit keyword
    arguments.

    Only switches and values whose TransformerConfig fields :func:`model.transformer_config`
    also sets explicitly go in; parallel sizes stay out, since an unknown ``--x 4`` would reach
    MindSpeed as the string "4". Not run on an Ascend host here: which further features read
    args this list lacks is not verified.
    """
    flags: list[str] = []
    switches = {
        "--use-flash-attn": layout.use_flash_attn,
        "--use-fused-rmsnorm": layout.use_fused_rmsnorm,
        "--use-fused-swiglu": layout.use_fused_swiglu,
        "--use-fused-rotary-pos-emb": layout.use_fused_rotary_pos_emb,
        "--sequence-parallel": layout.sequence_parallel,
        # PP sends each micro-batch's shape first (model.uses_variable_seq_lengths: the NPU
        # dispatcher is alltoall); MindSpeed patches p2p _communicate(_shapes) for it.
        "--variable-seq-lengths": layout.pipeline_model_parallel_size > 1,
    }
    flags += [flag for flag, on in switches.items() if on]
    # What the model is (every mapped family is a Qwen with RMSNorm, SwiGLU and RoPE): MindSpeed's
    # validators compare against these (FusedRoPEFeature: position_embedding_type == "rope").
    flags += ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope"]
    if layout.context_parallel_size > 1:
        # A string choice of MindSpeed's own parser (its _add_cp_args): which CP attention its
        # patched DotProductAttention builds (ring for megatron_cp_algo, Ulysses all-to-all for
        # ulysses_cp_algo). The size itself reaches it through TransformerConfig's explicit
        # context_parallel_size (an unregistered --context-parallel-size would arrive as a string).
        flags += ["--context-parallel-algo", layout.context_parallel_algo]
    if layout.swap_optimizer:
        # MindSpeed's SwapOptimizerFeature patches megatron's DistributedOptimizer with its
        # SwapDistributedOptimizer and its fused AdamW's step (the default --optimizer-selection
        # fused_adamw); its validate_args wants --use-distributed-optimizer among the args too.
        # --swap-optimizer-times stays at MindSpeed's default (plan.memory.SWAP_OPTIMIZER_TIMES).
        flags += ["--swap-optimizer", "--use-distributed-optimizer"]
    if layout.recompute_granularity is not None:
        flags += ["--recompute-granularity", layout.recompute_granularity]
        if layout.recompute_method is not None:
            flags += ["--recompute-method", layout.recompute_method]
        if layout.recompute_num_layers is not None:
            flags += ["--recompute-num-layers", str(layout.recompute_num_layers)]
    return flags


@contextlib.contextmanager
def presented_argv(flags: list[str]) -> Iterator[None]:
    """``sys.argv`` is ``[program, *flags]`` inside, the caller's list again after (also on error).

    In a Ray worker ``sys.argv`` holds Ray's worker arguments, not the training flags.
    """
    saved = sys.argv
    sys.argv = [saved[0] if saved else "mindspeed_rl", *flags]
    try:
        yield
    finally:
        sys.argv = saved


def import_mindspeed_adaptor(flags: list[str]) -> None:
    """Import MindSpeed's adaptor with exactly ``flags`` on the command line (once per process).

    A second import with other flags cannot take effect (MindSpeed's patches and args are
    process-wide): a ValueError. An adaptor some other code imported first is left as it is,
    with a warning, since its flags are unknown here.
    """
    global _mindspeed_flags
    wanted = tuple(flags)
    if MINDSPEED_ADAPTOR in sys.modules:
        if _mindspeed_flags is None:
            _log.warning(
                "%s was imported before the megatron engine; its flags come from that import, not from "
                "the engine's settings %s",
                MINDSPEED_ADAPTOR,
                list(wanted),
            )
        elif _mindspeed_flags != wanted:
            raise ValueError(
                f"MindSpeed was already set up in this process with {list(_mindspeed_flags)}, not "
                f"{list(wanted)}; its kernels are chosen once per process, so every megatron model of "
                "one process needs the same actor_config kernel and parallel switches"
            )
        return
    with presented_argv(list(wanted)):
        importlib.import_module(MINDSPEED_ADAPTOR)
    _mindspeed_flags = wanted


def import_megatron(layout: MegatronLayout | None = None) -> Any:
    """``megatron.core``, with MindSpeed's adaptor imported first when torch_npu is present.

    ``layout`` gives MindSpeed's flags (:func:`mindspeed_argv`; None: every switch off). A missing
    megatron-core is a ValueError naming the install line (the wheel declares Python >= 3.12,
    hence the flag on 3.11).
    """
    if has_torch_npu():
        # MindSpeed must patch megatron before any megatron module is imported.
        import_mindspeed_adaptor(mindspeed_argv(layout or MegatronLayout()))
    try:
        return importlib.import_module("megatron.core")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("megatron"):
            raise ValueError(
                f"the megatron training backend needs megatron-core; install it with `{MEGATRON_INSTALL}` "
                "(or `make setup`), or set megatron_training.use_mcore_models: false for the torch engine"
            ) from exc
        raise


@functools.cache
def has_torch_npu() -> bool:
    """Whether this is an Ascend host (torch_npu importable; found without importing it)."""
    return importlib.util.find_spec("torch_npu") is not None


def device_kind() -> DeviceKind:
    """npu when torch_npu is present (MindSpeed's ``transfer_to_npu`` makes ``torch.cuda`` answer
    for the NPU once the adaptor is imported), cuda with a CUDA device, else cpu."""
    if has_torch_npu():
        return "npu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def on_cpu() -> bool:
    return device_kind() == "cpu"


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

    On CPU the default tracker would fork CUDA generator states; the inference tracker does not.
    A process that already built a tracker (tests, the reference model next to the policy) must
    rebuild it: megatron keeps the first one otherwise.
    """
    from megatron.core import tensor_parallel

    if not on_cpu():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    seed_fn = tensor_parallel.model_parallel_cuda_manual_seed
    if "force_reset_rng" in inspect.signature(seed_fn).parameters:
        seed_fn(seed, inference_rng_tracker=True, force_reset_rng=True)
        return
    # megatron-core 0.12.1 (tensor_parallel/random.py) has no force_reset_rng: its
    # initialize_rng_tracker returns early while the module flag _CUDA_RNG_STATE_TRACKER_INITIALIZED
    # is set, so clear the flag and the tracker (what force_reset does in 0.19.2) first.
    random_module: Any = importlib.import_module("megatron.core.tensor_parallel.random")
    random_module._CUDA_RNG_STATE_TRACKER = None
    random_module._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    seed_fn(seed, inference_rng_tracker=True)


def adapt_dist_checkpoint_writer() -> bool:
    """Let megatron's async checkpoint writer call torch's ``_write_item`` as torch now wants it;
    True when it had to (on any device: it is about torch, not CUDA).

    ``FileSystemWriterAsync.write_preloaded_data`` calls torch's private
    ``filesystem._write_item(*transforms, stream, data, write_item, storage_key)``. torch 2.13
    (this machine) added a required ``serialization_format``; megatron-core 0.19.2 passes it when
    the signature has it, 0.12.1 does not (TypeError inside the writer process). Where megatron does
    not, its module gets a ``_write_item`` that defaults the argument to ``TORCH_SAVE``, the format
    torch's own FileSystemWriter writes by default.
    """
    module: Any = importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    original = module._write_item
    parameter = inspect.signature(original).parameters.get("serialization_format")
    if parameter is None or parameter.default is not inspect.Parameter.empty:
        return False  # this torch does not require it
    # unwrap: both versions decorate it with the context manager _disable_gc() (functools.wraps).
    code = getattr(inspect.unwrap(module.FileSystemWriterAsync.write_preloaded_data), "__code__", None)
    if code is not None and "serialization_format" in code.co_consts:
        return False  # this megatron passes it
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    def write_item(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("serialization_format", SerializationFormat.TORCH_SAVE)
        return original(*args, **kwargs)

    module._write_item = write_item
    return True


def in_process_checkpoint_results() -> bool:
    """Hand megatron's checkpoint writer threads' results to the saving rank over an in-process
    queue; True when installed (every device: it is about processes, not CUDA).

    megatron-core 0.19.2's ``filesystem_async.get_write_results_queue`` creates that queue on the
    first save as ``multiprocessing.get_context("spawn").Manager().Queue()``: a manager server per
    rank, a spawned process that re-imports the rank's entry module (2.5 s of CPU each on this
    host, two per TP2 run). Our saves are synchronous (``dist_checkpointing.save``, which runs the
    writer threads in the calling process and reads their results right after), so a thread-safe
    ``queue.Queue`` carries the same results. An async save (megatron's ``async_sharded_save``,
    results written by another process) would need the manager; nothing here starts one. False
    where megatron made its queue already, and on megatron-core 0.12.1, whose queue comes from a
    ``fork`` manager (cheap) through ``_get_write_results_queue``: there an in-process queue left
    the save's results empty (``results_queue should not be empty``, measured), so its own stays.
    """
    module: Any = importlib.import_module("megatron.core.dist_checkpointing.strategies.filesystem_async")
    if not hasattr(module, "get_write_results_queue") or getattr(module, "_results_queue", None) is not None:
        return False
    module._results_queue = queue.Queue()
    return True


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
    ``pin_memory=True`` is dropped: pinning only speeds a host-to-device copy, and a CPU-only torch
    has no pinned allocator (megatron-core 0.19.2's ``get_pos_emb_on_this_cp_rank`` builds its
    context-parallel index that way).
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
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
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
