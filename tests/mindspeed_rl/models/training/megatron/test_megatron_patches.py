"""Each megatron-on-CPU shim and MindSpeed's import, on their own (no megatron or MindSpeed needed)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mindspeed_rl.models.training.megatron import patches
from mindspeed_rl.models.training.megatron.layout import MegatronLayout

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shims are no-ops on CUDA hosts")


def test_current_device_answers_the_cpu_and_can_be_undone() -> None:
    original = torch.cuda.current_device
    try:
        patches.patch_current_device()
        assert torch.cuda.current_device() == torch.device("cpu")
        assert torch.zeros(1, device=torch.cuda.current_device()).device.type == "cpu"
    finally:
        patches.unpatch_current_device()
    assert torch.cuda.current_device is original


def test_causal_mask_blocks_exactly_the_future() -> None:
    mask = patches.causal_attention_mask(4, "cpu")
    assert mask.shape == (1, 1, 4, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[j > i for j in range(4)] for i in range(4)])
    assert torch.equal(mask[0, 0], expected)


def test_device_mode_maps_cuda_factories_and_tensor_cuda_to_cpu() -> None:
    with patches.CudaDeviceToCpu():
        made = torch.empty(3, device="cuda")
        made_idx = torch.zeros(2, device=torch.device("cuda", 0))
        moved = torch.ones(2).cuda()
    assert made.device.type == made_idx.device.type == moved.device.type == "cpu"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.empty(1, device="cuda")  # outside the mode nothing is rewritten


def test_runtime_mode_stubs_streams_and_sync_only_inside() -> None:
    original = (torch.cuda.synchronize, torch.cuda.current_stream)
    with patches.cpu_runtime_mode():
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        stream.wait_event(object())
        stream.wait_stream(stream)
        assert torch.zeros(1, device="cuda").device.type == "cpu"
    assert (torch.cuda.synchronize, torch.cuda.current_stream) == original


def test_runtime_mode_restores_on_error() -> None:
    original = torch.cuda.current_stream
    with pytest.raises(KeyError), patches.cpu_runtime_mode():
        raise KeyError("boom")
    assert torch.cuda.current_stream is original


def test_missing_megatron_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> object:
        if name.startswith("megatron"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="megatron")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ValueError, match="--ignore-requires-python megatron-core==0.19.2"):
        patches.import_megatron()


def test_other_missing_modules_are_not_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, package: str | None = None) -> object:
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="triton"):
        patches.import_megatron()


def _fake_tensor_parallel(monkeypatch: pytest.MonkeyPatch, seed_fn: object) -> types.ModuleType:
    random = types.ModuleType("megatron.core.tensor_parallel.random")
    random._CUDA_RNG_STATE_TRACKER = object()  # type: ignore[attr-defined]
    random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True  # type: ignore[attr-defined]
    tensor_parallel = types.ModuleType("megatron.core.tensor_parallel")
    tensor_parallel.model_parallel_cuda_manual_seed = seed_fn  # type: ignore[attr-defined]
    tensor_parallel.random = random  # type: ignore[attr-defined]
    core = types.ModuleType("megatron.core")
    core.tensor_parallel = tensor_parallel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", core)
    monkeypatch.setitem(sys.modules, "megatron.core.tensor_parallel", tensor_parallel)
    monkeypatch.setitem(sys.modules, "megatron.core.tensor_parallel.random", random)
    return random


def test_rng_seed_resets_the_tracker_through_force_reset_rng_where_it_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, dict[str, object]]] = []

    # megatron-core 0.19.2's keyword arguments.
    def seed_fn(
        seed: int,
        te_rng_tracker: bool = False,
        inference_rng_tracker: bool = False,
        force_reset_rng: bool = False,
    ) -> None:
        calls.append(
            (seed, {"inference_rng_tracker": inference_rng_tracker, "force_reset_rng": force_reset_rng})
        )

    random = _fake_tensor_parallel(monkeypatch, seed_fn)
    patches.seed_model_parallel_rng(7)
    assert calls == [(7, {"inference_rng_tracker": True, "force_reset_rng": True})]
    assert random._CUDA_RNG_STATE_TRACKER_INITIALIZED is True  # type: ignore[attr-defined]  # megatron's job here


def test_rng_seed_clears_the_tracker_itself_on_megatron_core_0_12(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, bool, object]] = []
    random: types.ModuleType

    # megatron-core 0.12.1's signature: no force_reset_rng; the tracker must be cleared before.
    def seed_fn(
        seed: int,
        te_rng_tracker: bool = False,
        inference_rng_tracker: bool = False,
        use_cudagraphable_rng: bool = False,
    ) -> None:
        seen.append((seed, inference_rng_tracker, random._CUDA_RNG_STATE_TRACKER_INITIALIZED))  # type: ignore[attr-defined]

    random = _fake_tensor_parallel(monkeypatch, seed_fn)
    patches.seed_model_parallel_rng(5)
    assert seen == [(5, True, False)]
    assert random._CUDA_RNG_STATE_TRACKER is None  # type: ignore[attr-defined]


def test_device_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patches, "has_torch_npu", lambda: True)
    assert patches.device_kind() == "npu" and not patches.on_cpu()
    monkeypatch.setattr(patches, "has_torch_npu", lambda: False)
    assert patches.device_kind() == "cpu" and patches.on_cpu()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert patches.device_kind() == "cuda"


# --- megatron's async checkpoint writer against torch's private _write_item ---


def _fake_writer_module(monkeypatch: pytest.MonkeyPatch, *, megatron_passes_format: bool) -> types.ModuleType:
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def torch_write_item(
        transforms: object, stream: object, data: object, item: object, key: str, serialization_format: object
    ) -> str:
        calls.append(((transforms, stream, data, item, key), {"serialization_format": serialization_format}))
        return "written"

    @contextlib.contextmanager
    def disable_gc() -> Iterator[None]:  # like megatron's _disable_gc(), which wraps the writer
        yield

    # The check reads the writer's code: 0.19.2 names the argument there, 0.12.1 never does.
    class Writer019:
        @staticmethod
        @disable_gc()
        def write_preloaded_data() -> object:
            return {"serialization_format": None}

    class Writer012:
        @staticmethod
        @disable_gc()
        def write_preloaded_data() -> object:
            return None

    module = types.ModuleType("megatron.core.dist_checkpointing.strategies.filesystem_async")
    module._write_item = torch_write_item  # type: ignore[attr-defined]
    module.FileSystemWriterAsync = Writer019 if megatron_passes_format else Writer012  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_checkpoint_writer_gets_the_serialization_format_megatron_0_12_leaves_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    module = _fake_writer_module(monkeypatch, megatron_passes_format=False)
    assert patches.adapt_dist_checkpoint_writer() is True
    assert module._write_item("t", "s", "d", "i", "k") == "written"  # type: ignore[attr-defined]
    assert module.calls == [
        (("t", "s", "d", "i", "k"), {"serialization_format": SerializationFormat.TORCH_SAVE})
    ]  # type: ignore[attr-defined]
    assert patches.adapt_dist_checkpoint_writer() is False  # once


def test_checkpoint_writer_is_left_alone_where_megatron_passes_the_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _fake_writer_module(monkeypatch, megatron_passes_format=True)
    original = module._write_item  # type: ignore[attr-defined]
    assert patches.adapt_dist_checkpoint_writer() is False
    assert module._write_item is original  # type: ignore[attr-defined]


# --- MindSpeed's adaptor: flags from the engine's settings, presented as sys.argv at import ---

RAY_ARGV = ["/ray/workers/default_worker.py", "--node-ip-address=10.0.0.1", "--object-store-name=/tmp/plasma"]

# Mirrors mindspeed/args_utils.py get_mindspeed_args() of release 26.1.0_core_r0.12.1: argparse
# parse_known_args() over sys.argv at import, unknown "--x" kept as x=True.
FAKE_ADAPTOR = """
import argparse, sys
IMPORTS = getattr(sys.modules.get("mindspeed"), "IMPORTS", 0) + 1
sys.modules["mindspeed"].IMPORTS = IMPORTS
seen_argv = list(sys.argv)
if "--explode" in sys.argv:
    raise RuntimeError("adaptor failed")
parser = argparse.ArgumentParser(allow_abbrev=False)
parser.add_argument("--use-fused-rmsnorm", action="store_true")
parser.add_argument("--optimization-level", type=int, default=2)
args, unknown = parser.parse_known_args()
"""


@pytest.fixture
def fake_mindspeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    package = tmp_path / "mindspeed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "megatron_adaptor.py").write_text(FAKE_ADAPTOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(RAY_ARGV))
    monkeypatch.setattr(patches, "_mindspeed_flags", None)
    yield
    for name in ("mindspeed.megatron_adaptor", "mindspeed"):
        sys.modules.pop(name, None)


def _adaptor() -> types.ModuleType:
    return sys.modules["mindspeed.megatron_adaptor"]


def test_mindspeed_flags_follow_the_layout() -> None:
    described = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope"]
    assert patches.mindspeed_argv(MegatronLayout()) == described
    layout = MegatronLayout(
        tensor_model_parallel_size=4,
        pipeline_model_parallel_size=2,
        sequence_parallel=True,
        use_flash_attn=True,
        use_fused_rmsnorm=True,
        use_fused_swiglu=True,
        use_fused_rotary_pos_emb=True,
        recompute_granularity="full",
        recompute_method="block",
        recompute_num_layers=3,
    )
    assert patches.mindspeed_argv(layout) == [
        "--use-flash-attn",
        "--use-fused-rmsnorm",
        "--use-fused-swiglu",
        "--use-fused-rotary-pos-emb",
        "--sequence-parallel",
        "--variable-seq-lengths",
        *described,
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "block",
        "--recompute-num-layers",
        "3",
    ]
    selective = patches.mindspeed_argv(MegatronLayout(recompute_granularity="selective"))
    assert selective == [*described, "--recompute-granularity", "selective"]


@pytest.mark.usefixtures("fake_mindspeed")
def test_adaptor_parses_exactly_the_engine_flags_and_argv_is_restored() -> None:
    before = sys.argv
    flags = patches.mindspeed_argv(MegatronLayout(use_fused_rmsnorm=True, use_flash_attn=True))
    patches.import_mindspeed_adaptor(flags)
    adaptor = _adaptor()
    assert adaptor.seen_argv == [RAY_ARGV[0], *flags]  # Ray's arguments are not in it
    assert adaptor.args.use_fused_rmsnorm is True
    assert "--use-flash-attn" in adaptor.unknown and not any("node-ip" in a for a in adaptor.unknown)
    assert sys.argv is before and sys.argv == RAY_ARGV


@pytest.mark.usefixtures("fake_mindspeed")
def test_argv_is_restored_when_the_adaptor_fails() -> None:
    with pytest.raises(RuntimeError, match="adaptor failed"):
        patches.import_mindspeed_adaptor(["--explode"])
    assert sys.argv == RAY_ARGV
    assert patches._mindspeed_flags is None


@pytest.mark.usefixtures("fake_mindspeed")
def test_adaptor_is_imported_once_and_other_flags_later_are_refused() -> None:
    patches.import_mindspeed_adaptor(["--use-fused-rmsnorm"])
    patches.import_mindspeed_adaptor(["--use-fused-rmsnorm"])
    assert sys.modules["mindspeed"].IMPORTS == 1  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="already set up in this process"):
        patches.import_mindspeed_adaptor(["--use-flash-attn"])


@pytest.mark.usefixtures("fake_mindspeed")
def test_adaptor_imported_by_someone_else_is_left_alone_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    importlib.import_module("mindspeed.megatron_adaptor")  # with Ray's argv, as a plain import would
    with caplog.at_level(logging.WARNING):
        patches.import_mindspeed_adaptor(["--use-flash-attn"])
    assert "imported before the megatron engine" in caplog.text
    assert sys.modules["mindspeed"].IMPORTS == 1  # type: ignore[attr-defined]


def test_import_megatron_on_npu_imports_the_adaptor_first_with_the_layout_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[object] = []
    monkeypatch.setattr(patches, "has_torch_npu", lambda: True)
    monkeypatch.setattr(patches, "import_mindspeed_adaptor", lambda flags: order.append(flags))
    monkeypatch.setattr(importlib, "import_module", lambda name, package=None: order.append(name))
    layout = MegatronLayout(tensor_model_parallel_size=2, sequence_parallel=True)
    patches.import_megatron(layout)
    assert order == [patches.mindspeed_argv(layout), "megatron.core"]
    order.clear()
    monkeypatch.setattr(patches, "has_torch_npu", lambda: False)
    patches.import_megatron(layout)
    assert order == ["megatron.core"]


def test_checkpoint_results_pass_in_process_where_megatron_would_start_a_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The installed megatron's queue global (real module): set once to an in-process queue, which
    its writer then uses; megatron-core 0.12.1 (no ``get_write_results_queue``) keeps its own."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not hasattr(filesystem_async, "get_write_results_queue"):
        before = getattr(filesystem_async, "_results_queue", None)
        assert patches.in_process_checkpoint_results() is False
        assert getattr(filesystem_async, "_results_queue", None) is before
        return
    monkeypatch.setattr(filesystem_async, "_results_queue", None)
    assert patches.in_process_checkpoint_results() is True
    installed = filesystem_async.get_write_results_queue()
    assert isinstance(installed, queue.Queue) and installed is filesystem_async._results_queue
    assert patches.in_process_checkpoint_results() is False  # once
    assert filesystem_async.get_write_results_queue() is installed
