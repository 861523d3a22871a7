"""Micro-batch planning across DP ranks: the k-th micro-batch has one shape on every rank and the
width of its own longest sample; fillers are dropped before the loss; values match wider padding."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.megatron.forward import Micro, micro_widths, plan_micros, real_rows


def _batch(num: int) -> TrainBatch:
    rng = np.random.default_rng(0)
    return TrainBatch.from_lists(
        prompt_ids=[rng.integers(1, 50, size=int(rng.integers(2, 6))) for _ in range(num)],
        response_ids=[rng.integers(1, 50, size=int(rng.integers(1, 9))) for _ in range(num)],
        advantages=rng.normal(size=num),
        old_log_probs=None,
    )


def _plans(batch: TrainBatch, dp_size: int, micro_batch_size: int) -> list[list[Micro]]:
    return [
        plan_micros(
            batch,
            dp_rank=r,
            dp_size=dp_size,
            micro_batch_size=micro_batch_size,
            pad_token_id=0,
            device=torch.device("cpu"),
        )
        for r in range(dp_size)
    ]


def _length(batch: TrainBatch, i: int) -> int:
    return int(batch.prompt_ids[i].size + batch.response_ids[i].size)


def test_every_dp_rank_gets_the_same_micro_shapes_and_all_samples_once() -> None:
    batch = _batch(7)
    plans = _plans(batch, dp_size=2, micro_batch_size=3)
    assert len(plans[0]) == len(plans[1]) == 2  # 4 and 3 samples -> 2 micro-batches each
    for k in range(2):  # the k-th micro-batch has one shape on every rank (MoE allgather over EP)
        assert plans[0][k].padded.input_ids.shape == plans[1][k].padded.input_ids.shape
    assert {m.padded.input_ids.shape[0] for plan in plans for m in plan} == {3}
    seen = sorted(int(i) for plan in plans for m in plan for i in m.indices)
    assert seen == list(range(7))


def test_each_micro_batch_is_padded_to_its_own_longest_sample_not_the_batch_longest() -> None:
    batch = _batch(12)
    plans = _plans(batch, dp_size=2, micro_batch_size=2)
    widest = max(_length(batch, i) for i in range(batch.num_samples))
    widths = []
    for k in range(len(plans[0])):
        longest_k = max(_length(batch, int(i)) for plan in plans for i in plan[k].indices)
        assert {plan[k].padded.input_ids.shape[1] for plan in plans} == {longest_k}
        widths.append(longest_k)
    assert min(widths) < widest and max(widths) == widest  # the saving is real, nothing is cut
    for plan in plans:  # right padding only: each row's tokens sit at its start, pads after
        for m in plan:
            for row, i in enumerate(m.indices):
                n = _length(batch, int(i))
                tokens = np.concatenate([batch.prompt_ids[i], batch.response_ids[i]])
                assert torch.equal(m.padded.input_ids[row, :n], torch.from_numpy(tokens))
                assert int(m.padded.attention_mask[row].sum()) == n


def test_run_widths_round_for_sequence_parallel_and_equalise_for_fixed_shape_pipelines() -> None:
    assert micro_widths([5, 9, 12]) == [5, 9, 12]
    assert micro_widths([5, 9, 12], multiple=4) == [8, 12, 12]
    assert micro_widths([5, 9, 12], multiple=4, uniform=True) == [12, 12, 12]
    assert micro_widths([], uniform=True) == []


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
    plans = _plans(batch, dp_size=2, micro_batch_size=4)
    assert [len(p) for p in plans] == [1, 1]
    assert plans[1][0].indices.size == 0
    assert plans[0][0].padded.input_ids.shape == plans[1][0].padded.input_ids.shape


def _log_probs_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo, parity_batch
    from mindspeed_rl.models.training.megatron.forward import response_log_probs, run_micros, widen
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout
    from mindspeed_rl.models.training.megatron.model import init_model_parallel, load_model
    from mindspeed_rl.weights.megatron_dims import load_dims

    init_gloo(rank, 1, port)
    try:
        layout = MegatronLayout()
        init_model_parallel(layout, seed=1)
        dims = load_dims(model_dir)
        model = load_model(model_dir, dims, layout, param_dtype="float32")
        model.eval()
        batch = parity_batch(dims.vocab_size, num_samples=8)
        micros = plan_micros(
            batch, dp_rank=0, dp_size=1, micro_batch_size=2, pad_token_id=0, device=torch.device("cpu")
        )
        widest = max(m.padded.input_ids.shape[1] for m in micros)
        at_widest = [dataclasses.replace(m, padded=widen(m.padded, widest, 0)) for m in micros]

        def loss_fn(
            micro: Micro, logits: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
            logp, _ = response_log_probs(
                logits, micro.padded, 1.0, vocab_size=dims.vocab_size, with_entropy=False
            )
            return logits.sum() * 0.0, torch.tensor(1), {"logp": logp * micro.padded.response_mask}

        with torch.no_grad():
            own = run_micros(model, micros, loss_fn, forward_only=True)
            wide = run_micros(model, at_widest, loss_fn, forward_only=True)
        torch.save(
            {
                "widths": [m.padded.input_ids.shape[1] for m in micros],
                "widest": widest,
                "own": [o["logp"] for o in own],
                "wide": [o["logp"] for o in wide],
            },
            out,
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core not installed (make setup installs it)",
)
@pytest.mark.timeout(300)
def test_narrower_micro_batches_give_the_same_log_probs(tmp_path: Path) -> None:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    model_dir = build_parity_model(tmp_path / "qwen3", "qwen3")
    out = tmp_path / "logp.pt"
    ranks.start_ranks(_log_probs_worker, (free_port(), str(model_dir), str(out)), 1)
    result = torch.load(out)
    assert min(result["widths"]) < result["widest"]  # some micro-batches did run narrower
    for own, wide in zip(result["own"], result["wide"], strict=True):
        # Not bit-identical: the matmuls' fp32 summation order depends on the sequence length
        # (measured max 1e-6); a pad token reaching a real one would move log-probs by ~1e-1.
        torch.testing.assert_close(own, wide, rtol=0, atol=1e-5)
