"""The off-policy correction on the megatron engine at TP2 over gloo (2 spawned processes) gives
the torch engine's loss, metrics and update: corrections act on per-token log-probs, which the
vocab-parallel path has already reduced, and every per-sequence reduction stays within a row."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed (make setup installs it)",
    ),
]


@pytest.mark.timeout(300)
def test_decoupled_loglinear_tis_with_rejection_matches_the_torch_engine_at_tp2(tmp_path: Path) -> None:
    from benchmarks.parity.engine import (
        LAYOUTS,
        parity_batch,
        parity_engine_config,
        run_megatron_side,
        update_rel_diffs,
        with_behaviour_log_probs,
    )
    from benchmarks.parity.models import build_parity_model
    from mindspeed_rl.models.loss.config import GRPOLossConfig
    from mindspeed_rl.models.loss.correction_config import RolloutCorrectionConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.weights.megatron_dims import load_dims

    model_dir = build_parity_model(tmp_path / "qwen3", "qwen3")
    batch = parity_batch(load_dims(model_dir).vocab_size)
    correction = RolloutCorrectionConfig(
        mode="decoupled", prox_logp="loglinear", rollout_is="sequence", is_upper=1.5,
        rollout_rs="token_k2", rollout_rs_threshold=0.02, m2_threshold=0.01,
    )  # fmt: skip
    config = dataclasses.replace(
        parity_engine_config(num_samples=batch.num_samples),
        mini_batch_size=4,  # two optimizer steps: the log-linear alpha of the second is < 1
        loss=GRPOLossConfig(init_kl_coef=0.05, entropy_coeff=0.01, rollout_correction=correction),
    )
    torch_engine = TorchTrainingEngine(model_dir, config)
    batch = with_behaviour_log_probs(batch, torch_engine.compute_log_probs(batch, temperature=0.7))
    assert batch.old_log_probs is not None
    # Versions relative to the fresh engine's (0): samples 1 and 2 versions stale.
    batch = dataclasses.replace(
        batch,
        rollout_log_probs=batch.old_log_probs,
        versions=tuple(
            np.full(r.shape, -1 - i % 2, dtype=np.int64) for i, r in enumerate(batch.response_ids)
        ),
    )
    before = {k: v.clone() for k, v in torch_engine.named_weights_for_inference()}
    want_metrics = torch_engine.update(batch, temperature=0.7)
    want = dict(torch_engine.named_weights_for_inference())
    meg = run_megatron_side(model_dir, LAYOUTS["tp2"], batch, config)
    got = meg["metrics"]
    assert want_metrics["rollout_corr/masked_frac"] > 0  # the masks act
    assert want_metrics["rollout_corr/is_clipped_frac"] > 0  # and the truncation
    assert abs(got["loss"] - want_metrics["loss"]) <= 1e-5
    rc_keys = [k for k in want_metrics if k.startswith("rollout_corr/")]
    assert {"rollout_corr/lag_1/is_weight_mean", "rollout_corr/lag_2/is_weight_mean"} <= set(rc_keys)
    assert set(rc_keys) == {k for k in got if k.startswith("rollout_corr/")}
    for key in rc_keys:
        assert got[key] == pytest.approx(want_metrics[key], rel=1e-4, abs=1e-6), key
    assert max(update_rel_diffs(before, meg["weights_after"], want).values()) <= 1e-3
