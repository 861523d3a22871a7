"""The whole weight path of the megatron engine, checked where it ends: in a vLLM engine.

One case = a model folder x a 2-rank layout::

    spawn 2 ranks:  MegatronTrainingEngine ─ update ─ per-rank snapshot (megatron names, shards)
                                           └─ save_hf(after/)            (the trainer's weights)
    this process:   GuConverter merges the shards ─► VLLMEngine.load_weights_from_path ─► generate
    spawn 2 ranks:  MegatronTrainingEngine(after/) ─ compute_log_probs(vLLM's responses)
    result:         max |vLLM log-prob - trainer log-prob| over every response token

The trainer's side is rebuilt from ``save_hf``'s folder because HF -> megatron -> HF is exact
(the parity cases check it), so it scores with the very weights the snapshot carried. Used by the
integration tests and ``benchmarks/megatron_parity.py --reload``; needs vLLM and megatron-core.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.parity.engine import LAYOUTS, free_port, init_gloo, parity_engine_config

PROMPTS = ([5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16])
SAMPLES_PER_PROMPT = 2
MAX_TOKENS = 12
RUN_ID = "reloadparity0001"


def _config(num_samples: int) -> Any:
    """The parity cases' optimiser, a visible step (lr 1e-2), no KL (there is no reference here)."""
    import dataclasses

    from mindspeed_rl.models.loss.config import GRPOLossConfig

    return dataclasses.replace(
        parity_engine_config(num_samples=num_samples), lr=1e-2, loss=GRPOLossConfig(init_kl_coef=0.0)
    )


def _train_and_export(rank: int, port: int, model_dir: str, layout: str, out: str) -> None:
    """One update, then this rank's snapshot shard (version 1) and the gathered HF folder."""
    import torch.distributed as dist

    init_gloo(rank, 2, port)
    try:
        from mindspeed_rl.models.training.batch import TrainBatch
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.weights.export import SnapshotWriter
        from mindspeed_rl.workers.megatron_engines import MegatronSnapshots

        rng = np.random.default_rng(0)
        batch = TrainBatch.from_lists(
            prompt_ids=[list(p) for p in PROMPTS for _ in range(2)],
            response_ids=[rng.integers(3, 30, size=6) for _ in range(2 * len(PROMPTS))],
            advantages=np.linspace(-1.0, 1.0, 2 * len(PROMPTS)).astype(np.float32),
        )
        config = _config(batch.num_samples)
        engine = MegatronTrainingEngine(model_dir, config, LAYOUTS[layout])
        engine.update(batch, temperature=1.0)
        part = MegatronSnapshots(engine)()
        if part.rank is not None:
            writer = SnapshotWriter(Path(out) / "snapshots", keep_last=2, run_id=RUN_ID)
            writer.export(1, part.tensors, part.layout, part.rank).result()
            writer.close()
        dist.barrier()
        engine.save_hf(Path(out) / "after")
    finally:
        dist.destroy_process_group()


def _score(rank: int, port: int, layout: str, out: str) -> None:
    import torch.distributed as dist

    init_gloo(rank, 2, port)
    try:
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine

        batch = torch.load(Path(out) / "responses.pt", weights_only=False)
        config = _config(batch.num_samples)
        engine = MegatronTrainingEngine(Path(out) / "after", config, LAYOUTS[layout])
        log_probs = engine.compute_log_probs(batch, temperature=1.0)
        if rank == 0:
            torch.save(log_probs, Path(out) / "trainer_log_probs.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_reload_case(model_dir: str | os.PathLike[str], layout: str) -> dict[str, Any]:
    """``{"reload_logprob_max_abs_diff", "num_tokens", "num_shards"}`` for ``layout`` (a 2-rank
    name of ``parity.LAYOUTS``); ``model_dir`` needs a tokenizer (vLLM loads one)."""
    import json

    from benchmarks.parity import ranks
    from mindspeed_rl.models.rollout.base import SamplingConfig
    from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine, VLLMOptions
    from mindspeed_rl.models.training.batch import TrainBatch
    from mindspeed_rl.weights.convert import GuConverter
    from mindspeed_rl.weights.layout import InferenceLayout
    from mindspeed_rl.weights.store import latest_published

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose from {sorted(LAYOUTS)}")
    with tempfile.TemporaryDirectory(prefix="megatron-reload-") as tmp:
        ranks.start_ranks(_train_and_export, (free_port(), os.fspath(model_dir), layout, tmp), 2)
        snapshot = latest_published(Path(tmp) / "snapshots")
        if snapshot is None:
            raise RuntimeError("the ranks published no snapshot")
        manifest = json.loads((snapshot.path / "manifest.json").read_text())
        converted = GuConverter(Path(tmp) / "gu", InferenceLayout(), num_threads=1).convert(snapshot)
        assert converted.converted is not None
        rollout = VLLMEngine(os.fspath(model_dir), options=VLLMOptions(max_model_len=64), seed=0)
        try:
            rollout.load_weights_from_path(str(converted.converted.path))
            sampling = SamplingConfig(max_tokens=MAX_TOKENS, temperature=1.0, seed=1)
            outputs = rollout.generate([list(p) for p in PROMPTS], sampling, n=SAMPLES_PER_PROMPT)
        finally:
            rollout.shutdown()
        flat = [c for samples in outputs for c in samples]
        batch = TrainBatch.from_lists(
            prompt_ids=[list(p) for p, samples in zip(PROMPTS, outputs, strict=True) for _ in samples],
            response_ids=[c.token_ids for c in flat],
            advantages=np.zeros(len(flat), dtype=np.float32),
        )
        torch.save(batch, Path(tmp) / "responses.pt")
        ranks.start_ranks(_score, (free_port(), layout, tmp), 2)
        ours = torch.load(Path(tmp) / "trainer_log_probs.pt", weights_only=False)
    diffs = [float(np.abs(a - np.asarray(c.log_probs)).max()) for a, c in zip(ours, flat, strict=True)]
    return {
        "reload_logprob_max_abs_diff": max(diffs),
        "num_tokens": int(sum(len(c.token_ids) for c in flat)),
        "num_shards": len(manifest["shards"]),
    }
