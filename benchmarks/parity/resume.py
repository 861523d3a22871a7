"""Resume parity of the megatron engine's distributed checkpoint, over gloo in 2 processes.

One case = a model folder x (save layout, load layout)::

    workers (gloo, 2 ranks):  engine(save layout) ─ update ─ save_state(ck) ─ update ─► weights "continued"
                              engine(load layout) ─ load_state(ck) ───────── update ─► weights "resumed"
    parent: max |continued - resumed| (0 at the same layout; fp32 summation noise across layouts)

The second update after the checkpoint uses the AdamW moments, step count and shuffle seed the
checkpoint restored, so a missing or mis-sharded piece of state shows as a large difference.
Used by the gloo integration tests and ``benchmarks/megatron_parity.py --resume``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.parity.engine import (
    LAYOUTS,
    free_port,
    init_gloo,
    parity_batch,
    parity_engine_config,
    with_behaviour_log_probs,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeResult:
    model: str
    saved_layout: str
    loaded_layout: str
    resume_max_abs_diff: float
    """Weights after one more update: continued in the saving engine vs resumed in a new one."""
    loss_abs_diff: float
    """That update's loss, continued vs resumed (restored old log-probs, KL and moments agree)."""
    load_max_abs_diff: float
    """Weights right after ``load_state`` vs those saved (0: the load is exact at any layout)."""
    checkpoint_files: tuple[str, ...]


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        raise AssertionError(f"weight names differ: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _worker(
    rank: int, port: int, model_dir: str, out_dir: str, layouts: tuple[str, str], load_optimizer: bool
) -> None:
    import torch.distributed as dist

    init_gloo(rank, 2, port)
    try:
        from megatron.core import parallel_state

        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine

        batch = torch.load(Path(out_dir) / "batch.pt", weights_only=False)
        config = parity_engine_config(num_samples=batch.num_samples)
        checkpoint = Path(out_dir) / "checkpoint"
        save_layout, load_layout = layouts
        engine = MegatronTrainingEngine(model_dir, config, LAYOUTS[save_layout])
        engine.update(batch, temperature=0.7)
        if rank == 0:
            checkpoint.mkdir()
        dist.barrier()
        engine.save_state(checkpoint)
        saved_weights = dict(engine.named_weights_for_inference())
        continued = engine.update(batch, temperature=0.7)
        continued_weights = dict(engine.named_weights_for_inference())
        del engine
        parallel_state.destroy_model_parallel()
        engine = MegatronTrainingEngine(model_dir, config, LAYOUTS[load_layout])
        engine.load_state(checkpoint, optimizer=load_optimizer, rng=save_layout == load_layout)
        loaded_weights = dict(engine.named_weights_for_inference())
        resumed = engine.update(batch, temperature=0.7)
        resumed_weights = dict(engine.named_weights_for_inference())
        if rank == 0:
            files = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
            result = {
                "diff": _max_abs_diff(continued_weights, resumed_weights),
                "load_diff": _max_abs_diff(saved_weights, loaded_weights),
                "loss": (continued["loss"], resumed["loss"]),
                "files": files,
            }
            torch.save(result, Path(out_dir) / "result.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_resume_case(
    model_dir: str | os.PathLike[str], save_layout: str, load_layout: str, *, load_optimizer: bool = True
) -> ResumeResult:
    """Save at ``save_layout``, resume at ``load_layout`` (names of ``parity.LAYOUTS``), compare.
    ``load_optimizer`` False: ``no_load_optim`` (fresh AdamW moments, so the next update differs)."""
    import numpy as np

    from benchmarks.parity import ranks
    from mindspeed_rl.weights.megatron_dims import load_dims

    unknown = sorted({save_layout, load_layout} - set(LAYOUTS))
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; choose from {sorted(LAYOUTS)}")
    batch = parity_batch(load_dims(model_dir).vocab_size)
    # Behaviour log-probs away from the policy's (ratios != 1): any value works for a comparison.
    rng = np.random.default_rng(5)
    batch = with_behaviour_log_probs(
        batch, [rng.normal(-3.0, 0.5, size=len(r)).astype(np.float32) for r in batch.response_ids]
    )
    with tempfile.TemporaryDirectory(prefix="megatron-resume-") as tmp:
        torch.save(batch, Path(tmp) / "batch.pt")
        layouts = (save_layout, load_layout)
        args: tuple[Any, ...] = (free_port(), os.fspath(model_dir), tmp, layouts, load_optimizer)
        ranks.start_ranks(_worker, args, 2)
        result = torch.load(Path(tmp) / "result.pt", weights_only=False)
    continued_loss, resumed_loss = result["loss"]
    return ResumeResult(
        model=Path(model_dir).name,
        saved_layout=save_layout,
        loaded_layout=load_layout,
        resume_max_abs_diff=float(result["diff"]),
        loss_abs_diff=abs(continued_loss - resumed_loss),
        load_max_abs_diff=float(result["load_diff"]),
        checkpoint_files=tuple(result["files"]),
    )
