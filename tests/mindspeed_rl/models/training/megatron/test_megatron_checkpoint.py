"""The megatron engine's distributed checkpoint: resume at the same layout is exact, at another
layout it reshards (weights and AdamW moments); foreign or incomplete checkpoints are refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
needs_megatron = pytest.mark.skipif(
    not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)"
)

CASES = [
    # (family, tied, saved layout, loaded layout)
    ("qwen3", False, "tp2", "tp2"),
    ("qwen3", False, "tp2", "dp2"),
    ("qwen3_moe", False, "ep2", "dp2"),
    ("qwen2", True, "pp2", "tp2"),
]


@pytest.mark.integration
@needs_megatron
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("family", "tied", "saved", "loaded"), CASES, ids=[f"{c[0]}-{c[2]}-to-{c[3]}" for c in CASES]
)
def test_resume_continues_the_run(tmp_path: Path, family: str, tied: bool, saved: str, loaded: str) -> None:
    from benchmarks.parity.models import build_parity_model
    from benchmarks.parity.resume import run_resume_case

    result = run_resume_case(build_parity_model(tmp_path / family, family, tied=tied), saved, loaded)
    if saved == loaded:
        assert result.resume_max_abs_diff == 0.0, result
        assert result.loss_abs_diff == 0.0, result
    else:  # the same sums in another order (TP-split matmuls, DP-split gradient sums)
        assert result.resume_max_abs_diff <= 1e-5, result
        assert result.loss_abs_diff <= 1e-6, result
    assert result.load_max_abs_diff == 0.0, result  # the load itself is exact at any layout
    files = set(result.checkpoint_files)
    assert {"config.json", "model.safetensors", "trainer_state.pt", "mcore_dist/.metadata"} <= files


@pytest.mark.integration
@needs_megatron
@pytest.mark.timeout(300)
def test_no_load_optim_restores_the_weights_with_fresh_moments(tmp_path: Path) -> None:
    from benchmarks.parity.models import build_parity_model
    from benchmarks.parity.resume import run_resume_case

    model = build_parity_model(tmp_path / "qwen3", "qwen3")
    result = run_resume_case(model, "tp2", "tp2", load_optimizer=False)
    assert result.load_max_abs_diff == 0.0, result
    # Fresh moments change the next step (Adam's first step is ~lr * sign(g)): far from the
    # continued run's, unlike the 0.0 of a full resume.
    assert result.resume_max_abs_diff > 1e-4, result


class _Engine:
    def __init__(self, layout: dict[str, int]) -> None:
        self._layout = layout

    def layout_key(self) -> dict[str, int]:
        return self._layout


TP2 = {"tp": 2, "pp": 1, "ep": 1, "world_size": 2}
DP2 = {"tp": 1, "pp": 1, "ep": 1, "world_size": 2}


def _saved(**overrides: Any) -> dict[str, Any]:
    return {"optimizer": "mcore_dist", "rng": [{}, {}], "layout": TP2, **overrides}


@needs_megatron
@pytest.mark.parametrize(
    ("state", "opts", "message"),
    [
        (
            {"optimizer": {}, "rng": {}},
            {},
            "written by the torch engine; resume it with megatron_training.use_mcore_models: false",
        ),
        (_saved(optimizer=None), {}, "no_load_optim: true"),
        (_saved(rng=None), {}, "no_load_rng: true"),
        (_saved(layout=DP2), {}, "per-rank RNG states do not"),
    ],
    ids=["torch-checkpoint", "no-optimizer", "no-rng", "other-layout"],
)
def test_unloadable_checkpoints_name_the_fix(
    state: dict[str, Any], opts: dict[str, bool], message: str
) -> None:
    from mindspeed_rl.models.training.megatron.checkpoint import _check_loadable

    with pytest.raises(ValueError, match=message):
        _check_loadable(state, Path("/ck"), _Engine(TP2), optimizer=True, rng=True)  # type: ignore[arg-type]


@needs_megatron
def test_another_layout_loads_without_rng() -> None:
    from mindspeed_rl.models.training.megatron.checkpoint import _check_loadable

    _check_loadable(_saved(layout=DP2), Path("/ck"), _Engine(TP2), optimizer=True, rng=False)  # type: ignore[arg-type]


def test_torch_engine_refuses_a_megatron_checkpoint(tmp_path: Path, tiny_model_path: Path) -> None:
    from mindspeed_rl.models.training import trainer_state
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    trainer_state.save_trainer_state(tmp_path, {"layout": TP2, "optimizer": "mcore_dist", "rng": None})
    engine = TorchTrainingEngine(tiny_model_path, TorchEngineConfig())
    with pytest.raises(ValueError, match="use_mcore_models: true"):
        engine.load_state(tmp_path)


class _Masters:
    """An engine's fp32 masters under its parameters' names (what ``gather_hf_weights`` reads)."""

    def __init__(self, engine: Any) -> None:
        names = {id(p): n for n, p in engine.model.module.named_parameters()}
        masters = engine.optimizer.master_params
        self._tensors = {names[id(p)]: m for p, m in zip(engine.optimizer.params, masters, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        return self._tensors


def _bf16_resume_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from benchmarks.parity.engine import LAYOUTS, init_gloo, parity_batch, parity_engine_config

    init_gloo(rank, 2, port)
    try:
        import dataclasses

        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.hf_export import gather_hf_weights

        batch = parity_batch(100)
        rng = np.random.default_rng(5)
        lps = [rng.normal(-3.0, 0.5, size=len(r)).astype(np.float32) for r in batch.response_ids]
        batch = batch.with_log_probs(old=lps, ref=lps)
        config = dataclasses.replace(
            parity_engine_config(num_samples=batch.num_samples), lr=1e-5, param_dtype="bfloat16"
        )
        checkpoint = Path(out) / "checkpoint"

        def build(layout: str) -> Any:
            parallel_state.destroy_model_parallel()
            return MegatronTrainingEngine(model_dir, config, LAYOUTS[layout])

        def masters(engine: Any) -> dict[str, torch.Tensor]:
            return gather_hf_weights(_Masters(engine), engine.dims, engine.layout)

        engine = build("tp2")
        engine.update(batch, temperature=0.7)
        if rank == 0:
            checkpoint.mkdir()
        dist.barrier()
        engine.save_state(checkpoint)
        result: dict[str, Any] = {"saved": masters(engine)}
        engine.update(batch, temperature=0.7)
        result["continued"] = masters(engine)
        engine = build("tp2")
        engine.load_state(checkpoint)
        result["loaded_tp2"] = masters(engine)
        engine.update(batch, temperature=0.7)
        result["resumed"] = masters(engine)
        engine = build("dp2")
        engine.load_state(checkpoint, rng=False)
        result["loaded_dp2"] = masters(engine)
        engine = build("tp2")
        engine.load_state(checkpoint, optimizer=False)
        result["fresh"] = masters(engine)
        result["fresh_weights"] = dict(engine.named_weights_for_inference())
        if rank == 0:
            torch.save(result, Path(out) / "result.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@needs_megatron
@pytest.mark.timeout(300)
def test_bf16_resume_restores_the_fp32_masters(tmp_path: Path) -> None:
    """The masters hold what the bf16 weights cannot (lr 1e-5 steps): saved with the optimizer,
    they come back exactly, at the same layout and resharded to another; without the optimizer
    (no_load_optim) they restart from the loaded weights."""
    import torch

    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model

    model = build_parity_model(tmp_path / "qwen3", "qwen3")
    ranks.start_ranks(_bf16_resume_worker, (free_port(), str(model), str(tmp_path)), 2)
    result = torch.load(tmp_path / "result.pt", weights_only=True)
    saved = result["saved"]
    assert {t.dtype for t in saved.values()} == {torch.float32}
    # Below a bf16 ulp: the masters are not their bf16 weights, so a rebuilt master would differ.
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in saved.values())
    for key in ("loaded_tp2", "loaded_dp2"):
        assert all(torch.equal(result[key][k], v) for k, v in saved.items()), key
    assert all(torch.equal(result["resumed"][k], v) for k, v in result["continued"].items())
    fresh, weights = result["fresh"], result["fresh_weights"]
    assert all(torch.equal(fresh[k], weights[k].float()) for k in fresh)


@needs_megatron
def test_the_distributed_optimizer_checkpoints_in_a_format_its_megatron_core_can_save() -> None:
    """megatron-core 0.19.2's default format for the distributed optimizer builds its shards as
    ShardedTensors with a ``flattened_range``, which the same version refuses at save (found on an
    H100 by ``benchmarks/device_check.py``); the engine names ``dp_reshardable`` there. 0.12.1
    (``make test-mcore012``) has no ``metadata`` and its default works: nothing is passed."""
    import dataclasses
    import inspect

    import torch
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from mindspeed_rl.models.training.megatron.checkpoint import optimizer_sharding
    from mindspeed_rl.models.training.megatron.layout import MegatronLayout

    chosen = optimizer_sharding(MegatronLayout())
    if "metadata" not in inspect.signature(DistributedOptimizer.sharded_state_dict).parameters:
        assert chosen == {}
        return
    assert chosen == {"metadata": {"distrib_optim_sharding_type": "dp_reshardable"}}
    assert "dp_reshardable" in inspect.getsource(DistributedOptimizer.sharded_state_dict)
    base = ShardedTensor.from_rank_offsets("w", torch.zeros(4, 4), replica_id=(0, 0, 0))
    with pytest.raises(CheckpointingException, match="flattened_range is not supported"):
        dataclasses.replace(base, data=torch.zeros(6), flattened_range=slice(2, 8))


@pytest.mark.parametrize("kind", ["adam", "adamw_amsgrad"])
def test_priming_an_empty_torch_adam_changes_no_step(kind: str) -> None:
    """Megatron's torch-Adam fallback is primed before a load (``prime_empty_torch_adam``: 0.19.2's
    distributed optimizer cannot build its sharded state from an empty one). Priming must be
    exactly torch's own first-step initialisation: the next steps from a primed and from an empty
    optimizer agree bit for bit. The wrapper is a stand-in for megatron's ChainedOptimizer over a
    DistributedOptimizer, which accepts only CUDA parameters; the optimizer inside is torch's."""
    from types import SimpleNamespace

    import torch

    from mindspeed_rl.models.training.megatron.checkpoint import prime_empty_torch_adam

    def build() -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(5, 3))
        if kind == "adam":
            return p, torch.optim.Adam([p], lr=0.1, weight_decay=0.01)
        return p, torch.optim.AdamW([p], lr=0.1, weight_decay=0.01, amsgrad=True)

    plain_p, plain = build()
    primed_p, primed = build()
    chain = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=primed)])
    assert prime_empty_torch_adam(chain) == 1
    assert prime_empty_torch_adam(chain) == 0  # a parameter with state is left alone
    assert primed.state_dict()["state"][0]["step"].item() == 0.0
    for step in range(3):
        for p, opt in ((plain_p, plain), (primed_p, primed)):
            p.grad = torch.full_like(p, 0.5 * (step + 1))
            opt.step()
        assert torch.equal(plain_p, primed_p), step
    assert plain.state_dict()["state"][0]["step"] == primed.state_dict()["state"][0]["step"]
