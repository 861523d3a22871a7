"""Response log-probs of a whole batch on megatron shards (forward only), the same on every rank.

Each DP rank scores its slice of the batch in micro-batches through megatron's schedule; the
rank that reports for its replica (last PP stage, TP rank 0) contributes its samples' log-probs
to an all-gather over the host group, so every rank returns every sample's. The policy and the
reference both score with it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist

from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.log_probs import check_temperature
from mindspeed_rl.models.training.megatron.forward import Micro, plan_micros, response_log_probs, run_micros
from mindspeed_rl.models.training.megatron.groups import dp_rank_size, host_group, reports_stats
from mindspeed_rl.models.training.megatron.routing_replay import ReplayPass
from mindspeed_rl.weights.megatron_dims import GPTDims


def compute_log_probs_megatron(
    model: torch.nn.Module,
    dims: GPTDims,
    batch: TrainBatch,
    *,
    temperature: float,
    micro_batch_size: int,
    pad_token_id: int,
    device: torch.device,
    replay: ReplayPass | None = None,
) -> list[np.ndarray]:
    """Response log-probs of every sample, identical on every rank (a collective call).

    ``replay``: routing replay's pass (entered by the caller), which routes each micro-batch by
    its ``batch.routing`` and/or captures the routing used. Without it, a batch that carries
    routing is replayed all the same (the reference pass), one that carries none is routed freely."""
    check_temperature(temperature)
    dp_rank, dp_size = dp_rank_size()
    micros = plan_micros(
        batch,
        dp_rank=dp_rank,
        dp_size=dp_size,
        micro_batch_size=micro_batch_size,
        pad_token_id=pad_token_id,
        device=device,
    )

    def loss_fn(
        micro: Micro, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        logp, _ = response_log_probs(
            logits, micro.padded, temperature, vocab_size=dims.vocab_size, with_entropy=False
        )
        one = torch.ones((), dtype=torch.int64, device=logits.device)
        return logits.sum() * 0.0, one, {"logp": logp.detach()}

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), contextlib.ExitStack() as stack:
            if replay is None and batch.routing is not None:
                replay = stack.enter_context(ReplayPass(model, replay=True, capture=False).session())
            around = None if replay is None else replay.micro
            outputs = run_micros(model, micros, loss_fn, forward_only=True, around_forward=around)
    finally:
        model.train(was_training)
    local: dict[int, np.ndarray] = {}
    if reports_stats():
        for micro, out in zip(micros, outputs, strict=True):
            logp = out["logp"].cpu()
            for row, (i, r) in enumerate(zip(micro.indices, micro.batch.response_ids)):
                local[int(i)] = logp[row, : r.size].numpy().copy()
    gathered: list[dict[int, np.ndarray] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local, group=host_group())
    merged: dict[int, np.ndarray] = {}
    for part in gathered:
        merged.update(part or {})
    missing = sorted(set(range(batch.num_samples)) - set(merged))
    assert not missing, f"no rank scored samples {missing[:5]}"
    return [merged[i] for i in range(batch.num_samples)]
