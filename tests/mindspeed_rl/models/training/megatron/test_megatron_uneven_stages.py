"""Uneven pipeline stages (upstream's ``num_layer_list``; ``noop_layers`` resolve to the same:
``stages.stage_layers``) on the real megatron engine over gloo: PP2 as 1 + 3 layers and a 6-layer
model over PP4 (1, 2, 2, 1: no even split exists) against the unsharded model (the torch engine on
the same weights): log-probs, loss, the gradient of each loss term, one update, the snapshot the
GU converts, and the HF folder the engine exports, which is the even split's too."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks.parity.engine import GRAD_TERMS, run_parity_case
from benchmarks.parity.models import build_parity_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed (make setup installs it)",
    ),
]


def _check_matches_unsharded(result: object) -> None:
    r = result  # a ParityResult
    assert r.name_mismatches == ()  # type: ignore[attr-defined]
    assert r.roundtrip_max_abs_diff == 0.0  # type: ignore[attr-defined]
    assert r.snapshot_merge_max_abs_diff == 0.0  # type: ignore[attr-defined]
    assert r.logprob_max_abs_diff <= 1e-4, r  # type: ignore[attr-defined]
    assert r.reference_logprob_max_abs_diff <= 1e-4, r  # type: ignore[attr-defined]
    assert r.update_max_rel_diff <= 1e-3, r  # type: ignore[attr-defined]
    assert r.convert_logit_max_abs_diff <= 1e-4, r  # type: ignore[attr-defined]
    assert r.loss_abs_diff <= 1e-5, r  # type: ignore[attr-defined]
    assert r.grad_norm_rel_diff <= 1e-4, r  # type: ignore[attr-defined]
    for term in GRAD_TERMS:
        assert r.grad_max_rel_diff[term] <= 1e-4, (term, r)  # type: ignore[attr-defined]


def _export(folder: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.timeout(600)
def test_pp2_with_one_and_three_layers_matches_the_even_model(tmp_path: Path) -> None:
    import torch

    model = build_parity_model(tmp_path / "qwen3", "qwen3", num_layers=4)
    _check_matches_unsharded(run_parity_case(model, "pp2_1_3", keep_export=tmp_path / "uneven"))
    # The same update at PP2 as 2 + 2 layers exports the same HF folder.
    run_parity_case(model, "pp2", keep_export=tmp_path / "even")
    uneven, even = _export(tmp_path / "uneven"), _export(tmp_path / "even")
    assert sorted(uneven) == sorted(even)
    assert {k.split(".")[2] for k in uneven if k.startswith("model.layers.")} == {"0", "1", "2", "3"}
    for name, tensor in uneven.items():
        assert torch.allclose(tensor, even[name], rtol=0, atol=1e-6), name  # type: ignore[arg-type]
    config = json.loads((tmp_path / "uneven" / "config.json").read_text())
    assert config["num_hidden_layers"] == 4


@pytest.mark.timeout(600)
def test_pp4_over_six_layers_matches_the_unsharded_model(tmp_path: Path) -> None:
    model = build_parity_model(tmp_path / "qwen2", "qwen2", tied=True, num_layers=6)
    _check_matches_unsharded(run_parity_case(model, "pp4_1_2_2_1"))
