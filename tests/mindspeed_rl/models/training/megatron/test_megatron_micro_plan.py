"""Micro-batch planning across DP ranks: equal shapes everywhere, fillers dropped before the loss."""

from __future__ import annotations

import numpy as np
import torch

from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.megatron.forward import plan_micros, real_rows


def _batch(num: int) -> TrainBatch:
    rng = np.random.default_rng(0)
    return TrainBatch.from_lists(
        prompt_ids=[rng.integers(1, 50, size=int(rng.integers(2, 6))) for _ in range(num)],
        response_ids=[rng.integers(1, 50, size=int(rng.integers(1, 9))) for _ in range(num)],
        advantages=rng.normal(size=num),
        old_log_probs=None,
    )


def test_every_dp_rank_gets_the_same_micro_shapes_and_all_samples_once() -> None:
    batch = _batch(7)
    plans = [
        plan_micros(
            batch, dp_rank=r, dp_size=2, micro_batch_size=3, pad_token_id=0, device=torch.device("cpu")
        )
        for r in range(2)
    ]
    shapes = {tuple(m.padded.input_ids.shape) for plan in plans for m in plan}
    widest = max(p.size + r.size for p, r in zip(batch.prompt_ids, batch.response_ids))
    assert shapes == {(3, widest)}
    assert len(plans[0]) == len(plans[1]) == 2  # 4 and 3 samples -> 2 micro-batches each
    seen = sorted(int(i) for plan in plans for m in plan for i in m.indices)
    assert seen == list(range(7))


def test_filler_rows_are_dropped_and_real_rows_keep_their_tensors() -> None:
    batch = _batch(3)
    (micro,) = plan_micros(
        batch, dp_rank=1, dp_size=2, micro_batch_size=2, pad_token_id=0, device=torch.device("cpu")
    )
    assert micro.indices.size == 1 and micro.padded.input_ids.shape[0] == 2
    real = real_rows(micro.padded, micro.indices.size)
    i = int(micro.indices[0])
    assert real.input_ids.shape[0] == 1
    assert torch.equal(real.targets[0, : batch.response_ids[i].size], torch.from_numpy(batch.response_ids[i]))
    assert float(real.advantages[0]) == float(batch.advantages[i])


def test_more_ranks_than_samples_gives_empty_micro_batches_not_missing_ones() -> None:
    batch = _batch(1)
    plans = [
        plan_micros(
            batch, dp_rank=r, dp_size=2, micro_batch_size=4, pad_token_id=0, device=torch.device("cpu")
        )
        for r in range(2)
    ]
    assert [len(p) for p in plans] == [1, 1]
    assert plans[1][0].indices.size == 0
