"""Context parallelism in the megatron engine: the split, the refusals, and CP2 against CP1.

The gloo test runs real megatron-core (parallel_state with context_parallel_size=2, GPTModel,
DDP over the data-parallel-with-CP group, the schedule) on a tiny Qwen3; only the attention
across the CP ranks is a STAND-IN (``tests/support/cp_attention.py``: all-gather of keys and
values, exact causal attention), because TransformerEngine's and MindSpeed's CP attention need a
GPU / NPU. CP1 runs megatron's own local attention on the same two ranks as DP2.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.training.megatron.context_parallel import rank_positions
from mindspeed_rl.models.training.megatron.cp_support import cp_problems
from mindspeed_rl.models.training.megatron.layout import MegatronLayout, check_trainable

_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)


@pytest.mark.parametrize("size", [2, 4])
def test_zigzag_split_gives_rank_r_chunks_r_and_2cp_minus_1_minus_r(size: int) -> None:
    width, chunk = 8 * size, 4
    seen = []
    for rank in range(size):
        got = rank_positions(width, size, rank, "zigzag", torch.device("cpu")).tolist()
        first, second = rank * chunk, (2 * size - 1 - rank) * chunk
        assert got == list(range(first, first + chunk)) + list(range(second, second + chunk))
        seen += got
    assert sorted(seen) == list(range(width))  # every position on exactly one rank


def test_contiguous_split_and_width_check() -> None:
    assert rank_positions(6, 2, 1, "contiguous", torch.device("cpu")).tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="not a multiple of 4"):
        rank_positions(6, 2, 0, "zigzag", torch.device("cpu"))


def test_cp_refused_where_no_cp_attention_exists_naming_what_to_install() -> None:
    cpu = cp_problems(2, "megatron_cp_algo", "cpu", "local")
    assert len(cpu) == 1 and "no attention kernel on CPU" in cpu[0] and "TransformerEngine" in cpu[0]
    assert "MindSpeed" in cpu[0]
    cuda = cp_problems(2, "megatron_cp_algo", "cuda", "local")
    assert len(cuda) == 1 and "CUDA without TransformerEngine" in cuda[0] and "install" in cuda[0]
    assert cp_problems(2, "megatron_cp_algo", "cuda", "transformer_engine") == []
    assert cp_problems(2, "ulysses_cp_algo", "npu", "local") == []
    assert cp_problems(1, "anything", "cpu", "local") == []
    # The test stand-in lets the CPU build through; the plan never registers one.
    assert cp_problems(2, "megatron_cp_algo", "cpu", "local", stand_in=True) == []


@pytest.mark.parametrize("algo", ["hybrid_cp_algo", "adaptive_cp_algo", "hybrid_adaptive_cp_algo"])
def test_algorithms_we_cannot_run_are_refused_by_name(algo: str) -> None:
    (problem,) = cp_problems(2, algo, "npu", "local")
    assert f"context_parallel_algo {algo}: not supported" in problem
    assert "megatron_cp_algo or ulysses_cp_algo" in problem
    (unknown,) = cp_problems(2, "ring", "cuda", "transformer_engine")
    assert "unknown algorithm" in unknown


def test_check_trainable_refuses_cp_on_cpu() -> None:
    layout = MegatronLayout(context_parallel_size=2)
    with pytest.raises(ValueError, match="context parallelism has no attention kernel on CPU"):
        check_trainable(False, layout, "cpu")
    check_trainable(False, layout, "cuda", transformer_engine=True)
    assert layout.data_parallel_size(8) == 4
    with pytest.raises(ValueError, match="TP x PP x CP = 2"):
        layout.data_parallel_size(3)


@pytest.mark.skipif(not _MEGATRON, reason="megatron-core not installed (make setup installs it)")
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_cp2_matches_cp1_in_log_probs_loss_and_gradients(tmp_path: Path) -> None:
    from benchmarks.parity.engine import GRAD_TERMS, grad_rel_diffs
    from benchmarks.parity.models import build_parity_model
    from tests.support.cp_parity import run_cp_parity

    model = build_parity_model(tmp_path / "qwen3", "qwen3", num_layers=2)
    result = run_cp_parity(model)
    cp2, cp1 = result["cp2"], result["cp1"]
    # The layouts are what they claim: CP2 is one replica of two CP ranks, CP1 two DP replicas.
    assert (cp2["cp_size"], cp2["dp_size"], cp1["cp_size"], cp1["dp_size"]) == (2, 1, 1, 2)
    assert cp2["split_matches_megatron"] is True
    # fp32 throughout: the two layouts differ only in summation order (attention over gathered
    # keys vs one matrix, DDP's sum over CP ranks vs DP ranks), ~1e-7 relative in fp32; 1e-5 on
    # log-probs of magnitude ~1-10 and 1e-4 relative on gradients leave two orders of margin,
    # while a token scored on the wrong rank, a chunk out of order or a gradient counted twice
    # (CP sum not reduced, or reduced twice) is off by O(1).
    for got, want in zip(cp2["log_probs"], cp1["log_probs"], strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac"):
        assert cp2["metrics"][key] == pytest.approx(cp1["metrics"][key], rel=1e-5, abs=1e-6), key
    assert cp2["metrics"]["grad_norm"] == pytest.approx(cp1["metrics"]["grad_norm"], rel=1e-5)
    for term in GRAD_TERMS:
        diffs = grad_rel_diffs(cp2["grads"][term], cp1["grads"][term])
        assert diffs and max(diffs.values()) <= 1e-4, (term, max(diffs.items(), key=lambda kv: kv[1]))
