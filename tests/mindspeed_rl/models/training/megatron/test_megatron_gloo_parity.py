"""The megatron engine over gloo (2 spawned processes) against HF and the torch engine.

Per layout: log-probs vs the HF forward of the same weights; one GRPO update (clip, KL, entropy
active) vs the torch engine's; HF -> megatron -> HF round trip exact; ``megatron_names`` equal to
the real ``GPTModel.state_dict()`` names on every rank.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mindspeed_rl.models.training.megatron.parity import build_parity_model, run_parity_case

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
    # with tied embeddings at DP2 and PP2 (the tied copy on the last stage); Qwen3-MoE at EP2.
    ("qwen3", False, "tp2"),
    ("qwen2", True, "dp2"),
    ("qwen3_moe", False, "ep2"),
    ("qwen2", True, "pp2"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "tied", "layout"), CASES, ids=[f"{f}-{lay}" for f, _, lay in CASES])
def test_megatron_engine_matches_hf_and_torch_engine(
    tmp_path: Path, family: str, tied: bool, layout: str
) -> None:
    model_dir = build_parity_model(tmp_path / family, family, tied=tied)
    result = run_parity_case(model_dir, layout)
    assert result.name_mismatches == ()
    assert result.roundtrip_max_abs_diff == 0.0
    assert result.snapshot_merge_max_abs_diff == 0.0
    assert result.logprob_max_abs_diff <= 1e-4, result
    assert result.update_max_rel_diff <= 1e-3, result
    assert result.convert_logit_max_abs_diff <= 1e-4, result
    assert result.loss_abs_diff <= 1e-5, result
    assert result.grad_norm_rel_diff <= 1e-4, result
