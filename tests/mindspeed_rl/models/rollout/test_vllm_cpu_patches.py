"""One test per vLLM CPU workaround in mindspeed_rl.utils.vllm_cpu_patches."""

from __future__ import annotations

import pytest
import torch

from mindspeed_rl.utils import vllm_cpu_patches


def test_cpu_env_defaults_do_not_override_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in vllm_cpu_patches.CPU_ENV_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    applied = vllm_cpu_patches.apply_cpu_env(kv_cache_space_gib=2)
    assert applied == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


def test_cpu_env_kv_cache_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert vllm_cpu_patches.apply_cpu_env(kv_cache_space_gib=2)["VLLM_CPU_KVCACHE_SPACE"] == "2"
    with pytest.raises(ValueError, match="at least 1"):
        vllm_cpu_patches.apply_cpu_env(kv_cache_space_gib=0)


def test_set_num_threads_is_restored_only_without_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    original = torch.set_num_threads

    def no_op(n: int) -> None:
        return None

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    with vllm_cpu_patches.keep_torch_set_num_threads():
        monkeypatch.setattr(torch, "set_num_threads", no_op)  # what vLLM's CPU worker does
    assert torch.set_num_threads is original

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    with vllm_cpu_patches.keep_torch_set_num_threads():
        monkeypatch.setattr(torch, "set_num_threads", no_op)
    assert torch.set_num_threads is no_op  # pinned threads: vLLM's guard stays


@pytest.mark.vllm
def test_head_dim_check_names_valid_sizes() -> None:
    pytest.importorskip("vllm")
    vllm_cpu_patches.check_cpu_head_dim(32)
    with pytest.raises(ValueError, match=r"head_dim=16.*kv_channels"):
        vllm_cpu_patches.check_cpu_head_dim(16)


@pytest.mark.vllm
def test_kernel_scan_survives_numba_being_imported_first() -> None:
    pytest.importorskip("vllm")
    import llvmlite.binding  # noqa: F401  (what importing numba / asp_scheduler does)
    from vllm.triton_utils import dispatcher

    vllm_cpu_patches.guard_kernel_scan()
    vllm_cpu_patches.guard_kernel_scan()  # idempotent: wraps once
    dispatcher._rebind_kernels([])  # unpatched, this raises AttributeError from llvmlite's ffi.lib
    assert "llvmlite.binding" in __import__("sys").modules


def test_the_sampler_counts_ranks_eagerly_and_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quirk 7: after the patch vLLM's sampler holds the uncompiled rank count, and it gives the
    compiled function's ranks (ties included: a token's rank counts every logprob >= its own)."""
    import vllm.v1.sample.ops.logprobs as ops
    import vllm.v1.sample.sampler as sampler

    # vLLM's decorator, re-applied: an engine this worker built earlier may have patched already.
    function = ops.batched_count_greater_than
    compiled = torch.compile(getattr(function, "_torchdynamo_orig_callable", function), backend="inductor")
    monkeypatch.setattr(ops, "batched_count_greater_than", compiled)  # both undone after the test
    monkeypatch.setattr(sampler, "batched_count_greater_than", compiled)
    assert vllm_cpu_patches.eager_sampler_rank_count()
    eager = sampler.batched_count_greater_than
    assert eager is ops.batched_count_greater_than and eager is not compiled
    assert not hasattr(eager, "_torchdynamo_orig_callable")
    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randn(5, 40, generator=generator).log_softmax(-1)
    logprobs[1, :] = logprobs[1, 0]  # near-uniform row: every entry ties
    chosen = logprobs.gather(-1, torch.randint(0, 40, (5, 1), generator=generator))
    torch.testing.assert_close(eager(logprobs, chosen), compiled(logprobs, chosen), rtol=0, atol=0)
    assert eager(logprobs, chosen)[1] == 40
    assert vllm_cpu_patches.eager_sampler_rank_count()  # again: nothing left to replace, still eager
    assert sampler.batched_count_greater_than is eager
