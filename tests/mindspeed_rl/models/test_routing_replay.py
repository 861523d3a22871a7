"""MoE routing replay on the tiny Qwen3-MoE: the HF rollout engine records routing, the torch
engine replays it, partial rollouts keep each segment's own routing (real models, no stand-ins)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mindspeed_rl.contracts import PartialRollout
from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.moe_routing import RouterHooks, moe_routers, stack_calls
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.hf_engine import HFEngine
from mindspeed_rl.models.tiny import TINY_QWEN3_MOE_ARCH, TINY_TEST_ARCH, create_tiny_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
from mindspeed_rl.runtime.routing import Routing, append_rows, routing_bytes_per_token, routing_dtype
from mindspeed_rl.workers.partial_rollout import generate_in_segments

PROMPTS = ([5, 9, 14, 3, 22, 40, 7], [11, 4, 60], [30, 31, 32, 33, 34])
SAMPLING = SamplingConfig(max_tokens=6, temperature=1.0, ignore_eos=True, seed=7)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("moe") / "model", TINY_QWEN3_MOE_ARCH, seed=0)


def _config() -> TorchEngineConfig:
    return TorchEngineConfig(
        lr=1e-3, clip_grad=0.0, micro_batch_size=2, forward_micro_batch_size=2, mini_batch_size=1,
        n_samples_per_prompt=2, loss=GRPOLossConfig(init_kl_coef=0.0), seed=3,
    )  # fmt: skip


def _routing_of(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """The routing of one unpadded forward over ``ids``: ``[len(ids), layers, top_k]``, sorted."""
    hooks = RouterHooks(model)
    with torch.no_grad(), hooks.capture() as calls:
        model(input_ids=torch.tensor([ids]))
    return np.sort(stack_calls(calls, 0).numpy(), axis=-1)


def _rollout(path: Path) -> tuple[HFEngine, list[tuple[list[int], list[int], list[float], np.ndarray]]]:
    engine = HFEngine(str(path), record_routing=True)
    out = engine.generate([list(p) for p in PROMPTS], SAMPLING, n=2)
    rows = [
        (list(p), list(c.token_ids), list(c.log_probs), np.asarray(c.routing))
        for p, per_prompt in zip(PROMPTS, out)
        for c in per_prompt
    ]
    return engine, rows


def _perturb_routers(model: torch.nn.Module, scale: float, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in moe_routers(model):
            w = router.weight
            w.add_(scale * w.abs().mean() * torch.randn(w.shape, generator=gen))


def test_routing_record_packs_compactly_and_round_trips() -> None:
    assert routing_dtype(4) == "uint8" and routing_dtype(256) == "uint8"
    assert routing_dtype(257) == "uint16"
    # Qwen3-30B-A3B: 48 MoE layers x top-8, 128 experts -> 384 bytes a token.
    assert routing_bytes_per_token(48, 8, 128) == 384
    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(128)[:8] for _ in range(5 * 3)]).reshape(5, 3, 8)
    r = Routing.from_array(a, 128)
    assert r.nbytes == 5 * 3 * 8 and r.dtype == "uint8"
    np.testing.assert_array_equal(r.array(), np.sort(a, axis=-1))
    with pytest.raises(ValueError, match="outside 0..3"):
        Routing.from_array(np.full((2, 1, 2), 4), 4)
    with pytest.raises(ValueError, match="expected 9"):
        r.check_covers(prompt_len=4, response_len=6, what="s")


def test_append_rows_keeps_recorded_positions() -> None:
    old = np.zeros((4, 2, 2), dtype=np.int64)
    new = np.ones((7, 2, 2), dtype=np.int64)
    merged = append_rows(old, new)
    assert merged.shape == (7, 2, 2)
    assert (merged[:4] == 0).all() and (merged[4:] == 1).all()
    with pytest.raises(ValueError, match="fewer than"):
        append_rows(new, old)


def test_hf_engine_records_the_routing_of_every_position(moe_path: Path) -> None:
    """Left-padded batched prefill + decode steps, mapped back per sample, equal one unpadded
    forward over the sample's prompt + response (all but the last token's position)."""
    engine, rows = _rollout(moe_path)
    for prompt, tokens, _, routing in rows:
        seq = prompt + tokens
        assert routing.shape == (len(seq) - 1, 2, 2)
        np.testing.assert_array_equal(np.sort(routing, axis=-1), _routing_of(engine.model, seq)[:-1])


def test_hf_engine_refuses_a_dense_model(tmp_path: Path) -> None:
    dense = create_tiny_model(tmp_path / "dense", TINY_TEST_ARCH, seed=0)
    with pytest.raises(ValueError, match="dense model routes nothing"):
        HFEngine(str(dense), record_routing=True)


def _batch(rows: list[tuple[list[int], list[int], list[float], np.ndarray]], replay: bool) -> TrainBatch:
    batch = TrainBatch.from_lists(
        prompt_ids=[r[0] for r in rows],
        response_ids=[r[1] for r in rows],
        advantages=np.linspace(-1, 1, len(rows)),
        rollout_log_probs=[r[2] for r in rows],
    )
    return batch.with_routing([r[3] for r in rows]) if replay else batch


def test_replay_makes_the_trainer_route_like_the_rollout(moe_path: Path) -> None:
    """Same weights: the replayed forward routes exactly as recorded and its log-probs are those of
    the unreplayed forward (same routing). Perturbed routers: without replay some rows route
    elsewhere; with replay every row routes as recorded and the log-prob gap to the rollout shrinks."""
    _, rows = _rollout(moe_path)
    recorded = [np.sort(r[3], axis=-1) for r in rows]
    behaviour = [np.asarray(r[2]) for r in rows]
    engine = TorchTrainingEngine(moe_path, _config())

    free_lp, free_routing, _ = engine.compute_log_probs_and_routing(_batch(rows, replay=False), 1.0)
    lp, used, metrics = engine.compute_log_probs_and_routing(_batch(rows, replay=True), 1.0)
    for got, want in zip(used, recorded):
        np.testing.assert_array_equal(np.sort(got, axis=-1), want)
    for a, b in zip(lp, free_lp):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert metrics["routing/recompute_router_disagree_frac"] == 0.0
    assert metrics["routing/recompute_replayed_rows"] == sum(r.shape[0] * r.shape[1] for r in recorded)

    _perturb_routers(engine.model, scale=0.5)
    drift_lp, drift_routing, _ = engine.compute_log_probs_and_routing(_batch(rows, replay=False), 1.0)
    differ = sum(int(np.any(np.sort(d, -1) != w, axis=-1).sum()) for d, w in zip(drift_routing, recorded))
    assert differ > 0, "the perturbation must flip some routing for the comparison to mean anything"
    replay_lp, replay_routing, metrics = engine.compute_log_probs_and_routing(_batch(rows, replay=True), 1.0)
    for got, want in zip(replay_routing, recorded):
        np.testing.assert_array_equal(np.sort(got, axis=-1), want)
    assert metrics["routing/recompute_router_disagree_frac"] > 0

    def gap(values: list[np.ndarray]) -> float:
        return float(np.mean(np.concatenate([np.abs(v - b) for v, b in zip(values, behaviour)])))

    assert gap(replay_lp) < gap(drift_lp), (gap(replay_lp), gap(drift_lp))


def test_training_forward_replays_and_trains_the_router(moe_path: Path) -> None:
    """The update's forward (with autograd) routes by the batch's routing, and the update's
    gradient reaches the router weights through the chosen experts' probabilities."""
    from mindspeed_rl.models.training.batch import pad_batch
    from mindspeed_rl.models.training.log_probs import forward_with_entropy

    _, rows = _rollout(moe_path)
    engine = TorchTrainingEngine(moe_path, _config())
    _perturb_routers(engine.model, scale=0.5)
    batch = _batch(rows, replay=True).with_log_probs(old=[np.asarray(r[2]) for r in rows])
    padded = pad_batch(batch, pad_token_id=0)
    hooks = RouterHooks(engine.model)
    with hooks.capture() as calls:
        logp, _ = forward_with_entropy(engine.model, padded, 1.0, entropy_grad=False, chunk_tokens=64)
    assert logp.requires_grad
    used = np.sort(stack_calls(calls, 0).numpy(), axis=-1).reshape(len(rows), -1, 2, 2)
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(used[i, : r[3].shape[0]], np.sort(r[3], axis=-1))

    before = [r.weight.detach().clone() for r in moe_routers(engine.model)]
    metrics = engine.update(batch, 1.0)
    assert metrics["routing/train_replayed_rows"] > 0
    assert metrics["routing/train_router_disagree_frac"] > 0
    after = [r.weight.detach() for r in moe_routers(engine.model)]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))


@dataclasses.dataclass(frozen=True)
class _Spanning:
    """One response decoded over two weight versions (v0: the built model, v1: perturbed routers)."""

    completion: Any
    seq: list[int]
    boundary: int
    """Rows before it are v0's; the last v0 token is first an input on v1."""
    v0: dict[str, torch.Tensor]
    v1: dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def spanning(moe_path: Path) -> tuple[HFEngine, _Spanning]:
    """Shared by the recording and the replay test (each reloads the weights it needs)."""
    engine = HFEngine(str(moe_path), record_routing=True)
    v0 = {k: v.clone() for k, v in engine.model.state_dict().items()}
    shifted = HFEngine(str(moe_path))
    _perturb_routers(shifted.model, scale=2.0, seed=1)
    v1 = {k: v.clone() for k, v in shifted.model.state_dict().items()}
    loaded: list[int] = []

    def refresh() -> int | None:
        if loaded:
            return None
        engine.model.load_state_dict(v1)
        loaded.append(1)
        return 1

    def generate(prompts, sampling, n, caps):  # type: ignore[no-untyped-def]
        return engine.generate(prompts, sampling, n=n, max_tokens_per_prompt=caps)

    out = generate_in_segments(
        generate, [list(PROMPTS[0])], [8], n=1, sampling=dataclasses.replace(SAMPLING, max_tokens=8),
        config=PartialRollout(max_split=2, chunk_tokens=3), version=0, refresh=refresh,
    )  # fmt: skip
    done = out[0][0]
    assert [(s.version, s.num_tokens) for s in done.segments] == [(0, 3), (1, 5)]
    seq = list(PROMPTS[0]) + list(done.completion.token_ids)
    spanning = _Spanning(completion=done.completion, seq=seq, boundary=len(PROMPTS[0]) + 3 - 1, v0=v0, v1=v1)
    return engine, spanning


def test_partial_rollout_keeps_each_segments_routing(spanning: tuple[HFEngine, _Spanning]) -> None:
    """A response decoded over two weight versions: positions decoded on v0 carry v0's routing,
    positions from the first input of v1 on carry v1's (each from a forward of that version)."""
    engine, span = spanning
    seq, boundary = span.seq, span.boundary
    routing = np.sort(np.asarray(span.completion.routing), axis=-1)
    assert routing.shape == (len(seq) - 1, 2, 2)
    engine.model.load_state_dict(span.v0)
    on_v0 = _routing_of(engine.model, seq[: boundary + 1])[:boundary]
    engine.model.load_state_dict(span.v1)
    on_v1 = _routing_of(engine.model, seq)[boundary:-1]
    np.testing.assert_array_equal(routing[:boundary], on_v0)
    np.testing.assert_array_equal(routing[boundary:], on_v1)
    # The two versions route this response differently, so the test tells the segments apart.
    assert not np.array_equal(_routing_of(engine.model, seq)[:boundary], on_v0)


def test_trainer_replays_each_segments_routing_of_a_spanning_sample(
    moe_path: Path, spanning: tuple[HFEngine, _Spanning]
) -> None:
    """R3 with partial rollouts: the trainer, on v1's weights, routes the v0 segment's rows by v0's
    record (not by its own v1 router, which chooses otherwise there) and the v1 segment's by v1's,
    in the log-prob recompute and in the update's forward."""
    span = spanning[1]
    record = np.asarray(span.completion.routing)
    tokens = list(span.completion.token_ids)
    trainer = TorchTrainingEngine(moe_path, dataclasses.replace(_config(), n_samples_per_prompt=1))
    trainer.model.load_state_dict(span.v1)
    batch = TrainBatch.from_lists(
        prompt_ids=[list(PROMPTS[0])], response_ids=[tokens], advantages=[1.0],
        rollout_log_probs=[list(span.completion.log_probs)],
    )  # fmt: skip
    free_lp, free, _ = trainer.compute_log_probs_and_routing(batch, 1.0)
    own_v1 = np.sort(free[0], axis=-1)
    wanted = np.sort(record, axis=-1)
    flipped = np.any(own_v1[: span.boundary] != wanted[: span.boundary], axis=-1)
    assert flipped.any(), "v1's router must disagree with v0's record somewhere for the test to mean anything"
    np.testing.assert_array_equal(own_v1[span.boundary :], wanted[span.boundary :])

    lp, used, metrics = trainer.compute_log_probs_and_routing(batch.with_routing([record]), 1.0)
    np.testing.assert_array_equal(np.sort(used[0], axis=-1), wanted)  # both segments, row for row
    assert metrics["routing/recompute_router_disagree_frac"] == pytest.approx(
        flipped.sum() / (record.shape[0] * record.shape[1])
    )
    # The v0 rows' routing reaches the scores: a v1-segment token's log-prob attends to them.
    assert not np.allclose(lp[0][3:], free_lp[0][3:], atol=1e-6)

    update = batch.with_routing([record]).with_log_probs(old=lp)
    metrics = trainer.update(update, 1.0)
    assert metrics["routing/train_replayed_rows"] == record.shape[0] * record.shape[1]
    assert metrics["routing/train_router_disagree_frac"] == pytest.approx(
        flipped.sum() / (record.shape[0] * record.shape[1])
    )
