"""Exported weights carry the checkpoint's names: tied embeddings, fused MoE experts, shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mindspeed_rl.models.loss import GRPOLossConfig
from mindspeed_rl.models.rollout.base import SamplingConfig
from mindspeed_rl.models.rollout.hf_engine import HFEngine
from mindspeed_rl.models.tiny import (
    TINY_QWEN3_MOE_ARCH,
    TINY_QWEN3_TIED_ARCH,
    TINY_QWEN25_ARCH,
    create_tiny_model,
)
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.hf_names import to_model_state
from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

ARCHS = {"tied": TINY_QWEN3_TIED_ARCH, "moe": TINY_QWEN3_MOE_ARCH, "qwen25": TINY_QWEN25_ARCH}
CONFIG = TorchEngineConfig(lr=1e-2, n_samples_per_prompt=1, loss=GRPOLossConfig(init_kl_coef=0.0))


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp(request.param) / "m", ARCHS[request.param], seed=0)


def test_export_equals_the_checkpoint_tensor_for_tensor(model_dir: Path) -> None:
    on_disk = load_file(model_dir / "model.safetensors")
    exported = dict(TorchTrainingEngine(model_dir, CONFIG).named_weights_for_inference())
    assert exported.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(exported[name], tensor), name


def test_hf_engine_reloads_an_export_into_its_fused_tied_model(model_dir: Path) -> None:
    engine = TorchTrainingEngine(model_dir, CONFIG)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    rollout = HFEngine(str(model_dir))
    rollout.load_weights(engine.named_weights_for_inference())
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(rollout.model.state_dict()[name], tensor), name
    out = rollout.generate([[5, 6, 7]], SamplingConfig(max_tokens=4, temperature=1.0, seed=0), n=1)[0][0]
    from mindspeed_rl.models.training.batch import TrainBatch

    batch = TrainBatch.from_lists(
        prompt_ids=[[5, 6, 7]], response_ids=[list(out.token_ids)], advantages=[0.0]
    )
    np.testing.assert_allclose(engine.compute_log_probs(batch, 1.0)[0], out.log_probs, atol=1e-5)


def test_a_partial_update_names_what_is_missing(tmp_path: Path) -> None:
    path = create_tiny_model(tmp_path / "m", TINY_QWEN3_MOE_ARCH, seed=0)
    rollout = HFEngine(str(path))
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.0.mlp.experts.2.up_proj.weight"]
    with pytest.raises(ValueError, match=r"experts.2.up_proj"):
        rollout.load_weights(tensors.items())
    with pytest.raises(ValueError, match=r"experts.2.up_proj"):
        to_model_state(tensors, rollout.model)


def test_sharded_folders_load_and_save_hf_shards(tmp_path: Path) -> None:
    path = create_tiny_model(tmp_path / "m", TINY_QWEN3_TIED_ARCH, seed=0)
    engine = TorchTrainingEngine(path, CONFIG)
    engine.save_hf(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert (tmp_path / "sharded" / "tokenizer.json").is_file()
    again = TorchTrainingEngine(tmp_path / "sharded", CONFIG)
    expected = dict(engine.named_weights_for_inference())
    got = dict(again.named_weights_for_inference())
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    rollout = HFEngine(str(path))
    rollout.load_weights_from_path(str(tmp_path / "sharded"))
    assert torch.equal(rollout.model.lm_head.weight, rollout.model.model.embed_tokens.weight)
