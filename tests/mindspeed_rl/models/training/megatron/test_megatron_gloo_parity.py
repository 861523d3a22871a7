"""The megatron engine over gloo (2 spawned processes) against HF and the torch engine.

Per layout: log-probs of the policy and of the reference model vs the HF forward of the same weights; one GRPO update (clip, KL, entropy
active) vs the torch engine's; the gradient of each loss term alone (policy, KL, entropy) vs the
torch engine's; HF -> megatron -> HF round trip exact; ``megatron_names`` equal to the real
``GPTModel.state_dict()`` names on every rank.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks.parity.engine import GRAD_TERMS, run_parity_case
from benchmarks.parity.models import build_near_uniform_model, build_parity_model

# find_spec, not importorskip: importing megatron at collection would slow every test tier.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed (make setup installs it)",
    ),
]

CASES = [
    # (family, tied embeddings, layout): dense untied with GQA + q/k norm at TP2; Qwen2 (QKV bias)
    # with tied embeddings at DP2 and PP2 (the tied copy on the last stage); Qwen3-MoE at EP2;
    # a Qwen2.5-shaped model at transformers' init (near-uniform log-probs) at TP2: an error in how
    # the vocab-parallel entropy shares the normaliser's gradient between TP ranks scales with how
    # far each rank's mean logit is from the global one, which peaked distributions make ~0.
    ("qwen3", False, "tp2"),
    ("qwen2", True, "dp2"),
    ("qwen3_moe", False, "ep2"),
    ("qwen2", True, "pp2"),
    ("qwen25_near_uniform", False, "tp2"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "tied", "layout"), CASES, ids=[f"{f}-{lay}" for f, _, lay in CASES])
def test_megatron_engine_matches_hf_and_torch_engine(
    tmp_path: Path, family: str, tied: bool, layout: str
) -> None:
    if family == "qwen25_near_uniform":
        model_dir = build_near_uniform_model(tmp_path / family)
    else:
        model_dir = build_parity_model(tmp_path / family, family, tied=tied)
    result = run_parity_case(model_dir, layout)
    assert result.name_mismatches == ()
    assert result.roundtrip_max_abs_diff == 0.0
    assert result.snapshot_merge_max_abs_diff == 0.0
    assert result.logprob_max_abs_diff <= 1e-4, result
    assert result.reference_logprob_max_abs_diff <= 1e-4, result
    assert result.update_max_rel_diff <= 1e-3, result
    assert result.convert_logit_max_abs_diff <= 1e-4, result
    assert result.loss_abs_diff <= 1e-5, result
    assert result.grad_norm_rel_diff <= 1e-4, result
    assert set(result.grad_max_rel_diff) == set(GRAD_TERMS)
    for term in GRAD_TERMS:
        assert result.grad_max_rel_diff[term] <= 1e-4, (term, result)


@pytest.mark.timeout(300)
def test_several_shuffled_steps_with_clipping_and_sequence_loss_match_at_tp2(tmp_path: Path) -> None:
    """4 optimizer steps (2 mini-batches x 2 epochs, shuffled), grad clipping active,
    sequence-level aggregation: the engine's loop, schedule and clip agree with the torch engine."""
    import dataclasses

    from benchmarks.parity.engine import (
        LAYOUTS,
        parity_batch,
        parity_engine_config,
        run_megatron_side,
        update_rel_diffs,
        with_behaviour_log_probs,
    )
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.weights.megatron_dims import load_dims

    model_dir = build_parity_model(tmp_path / "qwen3", "qwen3")
    batch = parity_batch(load_dims(model_dir).vocab_size)
    config = dataclasses.replace(
        parity_engine_config(num_samples=batch.num_samples),
        mini_batch_size=4,
        epochs=2,
        shuffle_mini_batch=True,
        clip_grad=0.5,
        loss=GRPOLossConfig(init_kl_coef=0.05, token_level_loss=False, entropy_coeff=0.01),
    )
    torch_engine = TorchTrainingEngine(model_dir, config)
    batch = with_behaviour_log_probs(batch, torch_engine.compute_log_probs(batch, temperature=0.7))
    before = {k: v.clone() for k, v in torch_engine.named_weights_for_inference()}
    want_metrics = torch_engine.update(batch, temperature=0.7)
    want = dict(torch_engine.named_weights_for_inference())
    meg = run_megatron_side(model_dir, LAYOUTS["tp2"], batch, config)
    assert meg["metrics"]["num_optimizer_steps"] == want_metrics["num_optimizer_steps"] == 4
    assert want_metrics["grad_norm"] > 0.5  # clipping was active
    assert abs(meg["metrics"]["grad_norm"] / want_metrics["grad_norm"] - 1) <= 1e-4
    assert max(update_rel_diffs(before, meg["weights_after"], want).values()) <= 1e-3


@pytest.mark.timeout(300)
def test_loss_masks_of_multi_turn_samples_match_the_torch_engine_at_tp2(tmp_path: Path) -> None:
    """Tool-response tokens masked out of the loss (``TrainBatch.loss_masks``): the megatron
    engine's update equals the torch engine's, and differs from the unmasked update (the mask acts)."""
    import dataclasses

    import numpy as np

    from benchmarks.parity.engine import (
        LAYOUTS,
        parity_batch,
        parity_engine_config,
        run_megatron_side,
        update_rel_diffs,
        with_behaviour_log_probs,
    )
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.weights.megatron_dims import load_dims

    model_dir = build_parity_model(tmp_path / "qwen3", "qwen3")
    batch = parity_batch(load_dims(model_dir).vocab_size)
    # Mask the middle third of every response of 3+ tokens: a "tool response" between two turns.
    masks = []
    for r in batch.response_ids:
        m = np.ones(r.size, dtype=np.int64)
        if r.size >= 3:
            m[r.size // 3 : 2 * r.size // 3] = 0
        masks.append(m)
    assert sum(int(m.size - m.sum()) for m in masks) > 0
    config = dataclasses.replace(
        parity_engine_config(num_samples=batch.num_samples),
        loss=GRPOLossConfig(init_kl_coef=0.05, entropy_coeff=0.01),
    )
    weights = {}
    for name, masked in (("masked", dataclasses.replace(batch, loss_masks=tuple(masks))), ("plain", batch)):
        torch_engine = TorchTrainingEngine(model_dir, config)
        masked = with_behaviour_log_probs(masked, torch_engine.compute_log_probs(masked, temperature=0.7))
        before = {k: v.clone() for k, v in torch_engine.named_weights_for_inference()}
        torch_engine.update(masked, temperature=0.7)
        weights[name] = dict(torch_engine.named_weights_for_inference())
        if name == "masked":
            meg = run_megatron_side(model_dir, LAYOUTS["tp2"], masked, config)
            assert max(update_rel_diffs(before, meg["weights_after"], weights[name]).values()) <= 1e-3
    assert max(update_rel_diffs(before, weights["plain"], weights["masked"]).values()) > 1e-2
