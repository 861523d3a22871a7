"""The megatron engine at context parallel 2 against context parallel 1, over gloo, for tests.

Two spawned ranks run the same tiny model twice: CP2 (one DP replica whose two CP ranks split
every sequence; the attention across them is :mod:`tests.support.cp_attention`'s stand-in) and
CP1 (the same two ranks as DP2, megatron's own local attention). Each records the log-probs of a
batch, one update's loss terms, and, per loss term, the gradient the engine hands its optimizer
(merged to HF tensors as the weights are). Rank 0 saves both for the test to compare.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.parity.engine import (
    GRAD_TERMS,
    _megatron_term_grads,
    free_port,
    grad_term_case,
    init_gloo,
    parity_batch,
    parity_engine_config,
)
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.megatron.layout import MegatronLayout

LAYOUTS = {
    "cp2": MegatronLayout(context_parallel_size=2, context_parallel_algo="megatron_cp_algo"),
    "cp1": MegatronLayout(),
}


def cp_batch(vocab_size: int) -> TrainBatch:
    """Ragged samples (widths 5..19, so padding to 2 x CP is exercised) with behaviour and
    reference log-probs (any values: both layouts see the same ones)."""
    batch = parity_batch(vocab_size, num_samples=6, seed=4)
    rng = np.random.default_rng(5)
    old = [rng.normal(-3.0, 0.5, size=r.size).astype(np.float32) for r in batch.response_ids]
    ref = [rng.normal(-3.0, 0.5, size=r.size).astype(np.float32) for r in batch.response_ids]
    return batch.with_log_probs(old=old, ref=ref)


def _split_matches_megatron(width: int) -> bool:
    """This rank's positions (``context_parallel.local_positions``) against megatron-core 0.19.2's
    own ``get_batch_on_this_cp_rank`` on the same ids (0.12.1's takes other arguments: skipped)."""
    import inspect

    from megatron.core import parallel_state as ps
    from megatron.core import utils

    from mindspeed_rl.models.training.megatron import context_parallel

    ids = torch.arange(width).reshape(1, width)
    if "is_hybrid_cp" not in inspect.signature(utils.get_batch_on_this_cp_rank).parameters:
        return True
    theirs = utils.get_batch_on_this_cp_rank(
        {"tokens": ids.clone(), "cu_seqlens": None}, False, cp_group=ps.get_context_parallel_group()
    )["tokens"]
    mine = context_parallel.local_positions(width, ids.device)
    assert mine is not None
    return bool(torch.equal(theirs, ids[:, mine]))


def _worker(
    rank: int, world: int, port: int, model_dir: str, out_dir: str, config: TorchEngineConfig
) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.training.megatron import context_parallel
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from tests.support.cp_attention import AllGatherKVAttentionStandIn

    init_gloo(rank, world, port)
    context_parallel.set_attention_stand_in(AllGatherKVAttentionStandIn)
    try:
        batch: TrainBatch = torch.load(Path(out_dir) / "batch.pt", weights_only=False)
        results: dict[str, Any] = {}
        for name, layout in LAYOUTS.items():
            engine = MegatronTrainingEngine(model_dir, config, layout)
            out: dict[str, Any] = {
                "cp_size": ps.get_context_parallel_world_size(),
                "dp_size": ps.get_data_parallel_world_size(),
                "split_matches_megatron": _split_matches_megatron(16)
                if layout.context_parallel_size > 1
                else None,
                "log_probs": engine.compute_log_probs(batch, temperature=0.7),
                "metrics": engine.update(batch, temperature=0.7),
            }
            out["grads"] = {
                term: _megatron_term_grads(model_dir, layout, *grad_term_case(config, batch, term))
                for term in GRAD_TERMS
            }
            results[name] = out
            del engine
            ps.destroy_model_parallel()
        if rank == 0:
            torch.save(results, Path(out_dir) / "result.pt")
        dist.barrier()
    finally:
        context_parallel.set_attention_stand_in(None)
        dist.destroy_process_group()


def run_cp_parity(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Both layouts' records (``{"cp2": ..., "cp1": ...}``) from two spawned gloo ranks."""
    from benchmarks.parity import ranks
    from mindspeed_rl.weights.megatron_dims import load_dims

    dims = load_dims(model_dir)
    batch = cp_batch(dims.vocab_size)
    config = parity_engine_config(num_samples=batch.num_samples)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(batch, Path(tmp) / "batch.pt")
        ranks.start_ranks(_worker, (2, free_port(), os.fspath(model_dir), tmp, config), 2)
        result: dict[str, Any] = torch.load(Path(tmp) / "result.pt", weights_only=False)
    return result
