"""The megatron engine's HF weights leave shard by shard: ``save_hf`` and the hybrid push
(``named_weights_for_inference``) merge every rank's snapshot-format shard on rank 0's host with
the GU's rules, and give exactly the tensors the whole-model gather gave (``hf_pieces`` of every
rank, ``assemble_hf``); so does the colocated push (``weight_stream``: every rank gets the whole
model, broadcast and merged group by group); no weight goes through a Python-object collective."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

HAVE_MEGATRON = (
    importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
)
REPO = Path(__file__).resolve().parents[5]
OBJECT_COLLECTIVES = {"all_gather_object", "gather_object", "broadcast_object_list", "send_object_list", "recv_object_list"}  # fmt: skip
ENGINE_FILES = (
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "mindspeed_rl/models/training/megatron").glob("*.py")),
    "mindspeed_rl/workers/megatron_engines.py",
)
"""Every module of the megatron engine (the package, whatever its split) and its Training Unit side."""


def test_object_collectives_of_the_engine_go_over_the_host_group() -> None:
    """Every Python-object collective names ``group=host_group()`` (gloo: never the device), and
    none carries the weights: only log-probs, coordinates, RNG states, shard metadata and the
    routing the MoE routers used and its counts (integers, ``routing_replay.py``)."""
    found = 0
    for relative in ENGINE_FILES:
        tree = ast.parse((REPO / relative).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr not in OBJECT_COLLECTIVES:
                continue
            found += 1
            where = f"{relative}:{node.lineno}"
            groups = [k.value for k in node.keywords if k.arg == "group"]
            assert groups and ast.unparse(groups[0]) == "host_group()", f"{where}: {ast.unparse(node)}"
            assert node.func.attr != "gather_object", f"{where}: weights reach rank 0 by ShardCollector"
            sent = ast.unparse(node.args[1] if node.func.attr == "all_gather_object" else node.args[0])
            assert sent in {"local", "self._coords", "coords", "[meta]", "received", "trainer_state.capture_rng() if rng else None", "self._rows", "counts"}, where  # fmt: skip
    assert found >= 5


def _old_gather(engine: Any) -> dict[str, torch.Tensor]:
    """What the engine's whole-model gather assembled: every rank's ``hf_pieces`` (DP rank 0, or
    expert-DP rank 0 for experts), concatenated by ``assemble_hf``; gathered here for the check."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.training.megatron.hf_mapping import assemble_hf, hf_pieces
    from mindspeed_rl.models.training.megatron.model import rank_coords
    from mindspeed_rl.models.training.megatron.param_names import is_weight_name

    coords = rank_coords(engine.layout)
    state = engine.model.module.state_dict()
    pieces = [
        p
        for name, t in state.items()
        if is_weight_name(name)
        for p in hf_pieces(name, t.cpu(), engine.dims, coords)
    ]
    keep = ps.get_data_parallel_rank() == 0 or ps.get_expert_data_parallel_rank() == 0
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, pieces if keep else [])
    unique = {(p.name, p.dim, p.index): p for part in gathered for p in part}
    return assemble_hf(unique.values(), engine.dims)


def _worker(rank: int, port: int, model_dir: str, layout_name: str, dtype: str, out_dir: str) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import LAYOUTS, init_gloo

    init_gloo(rank, 2, port)
    try:
        from safetensors.torch import save_file

        from mindspeed_rl.models.loss.config import GRPOLossConfig
        from mindspeed_rl.models.training.batch import TrainBatch
        from mindspeed_rl.models.training.engine_config import TorchEngineConfig
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine

        config = TorchEngineConfig(
            lr=1e-2, micro_batch_size=1, mini_batch_size=2, n_samples_per_prompt=1,
            loss=GRPOLossConfig(init_kl_coef=0.0), param_dtype=dtype,  # type: ignore[arg-type]
        )  # fmt: skip
        engine = MegatronTrainingEngine(model_dir, config, LAYOUTS[layout_name])
        batch = TrainBatch.from_lists(
            prompt_ids=[[3, 4, 5], [6, 7]],
            response_ids=[[8, 9], [10, 11, 12]],
            advantages=np.array([1.0, -1.0]),
        )
        engine.update(batch, 1.0)  # moved weights, so a stale copy would show
        out = Path(out_dir)
        engine.save_hf(out / "saved")
        pushed = dict(engine.named_weights_for_inference())
        old = _old_gather(engine)
        # The colocated push: every rank streams the whole model, twice (the plan is cached).
        for round_ in range(2):
            stream = engine.weight_stream()
            announced = stream.shapes
            streamed = {name: t.clone() for name, t in stream}
            assert tuple((n, tuple(t.shape)) for n, t in streamed.items()) == announced
            save_file(streamed, str(out / f"streamed-{rank}-{round_}.safetensors"))
            if round_ == 0:
                engine.update(batch, 1.0)
        old_after = _old_gather(engine)
        if rank == 0:
            save_file({k: v.contiguous() for k, v in old_after.items()}, str(out / "old-after.safetensors"))
            save_file({k: v.contiguous() for k, v in old.items()}, str(out / "old.safetensors"))
            save_file({k: v.contiguous() for k, v in pushed.items()}, str(out / "pushed.safetensors"))
        else:
            assert pushed == {}
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core not installed (make setup installs it)")
@pytest.mark.parametrize(
    ("family", "layout_name", "dtype"),
    [("qwen3", "tp2", "float32"), ("qwen2", "pp2", "bfloat16"), ("qwen3_moe", "ep2", "float32")],
)
def test_hf_folder_and_push_are_the_gathered_weights(
    tmp_path: Path, family: str, layout_name: str, dtype: str
) -> None:
    from safetensors.torch import load_file

    from benchmarks.parity.engine import free_port
    from benchmarks.parity.models import build_parity_model
    from benchmarks.parity.ranks import start_ranks

    model_dir = build_parity_model(tmp_path / family, family, tied=family == "qwen2")
    out = tmp_path / "out"
    out.mkdir()
    args = (free_port(), str(model_dir), layout_name, dtype, str(out))
    start_ranks(_worker, args, 2)
    old = load_file(str(out / "old.safetensors"))
    saved = load_file(str(out / "saved" / "model.safetensors"))
    pushed = load_file(str(out / "pushed.safetensors"))
    assert set(saved) == set(old) == set(pushed)
    for name, want in old.items():
        for got in (saved[name], pushed[name]):
            assert (got.dtype, got.shape) == (want.dtype, want.shape), name
            assert _raw(got) == _raw(want), name
    assert {t.dtype for t in saved.values()} == {getattr(torch, dtype)}
    # Every rank's colocated stream: exactly the gathered weights, before and after a step.
    after = load_file(str(out / "old-after.safetensors"))
    for rank in range(2):
        for round_, want_all in ((0, old), (1, after)):
            streamed = load_file(str(out / f"streamed-{rank}-{round_}.safetensors"))
            assert set(streamed) == set(pushed), (rank, round_)
            for name, want in want_all.items():
                assert _raw(streamed[name]) == _raw(want), (rank, round_, name)
    assert any(_raw(after[n]) != _raw(old[n]) for n in old)  # the step moved the weights
    files = {p.name for p in (out / "saved").iterdir()}
    assert "config.json" in files and not any(name.startswith(".") for name in files), files
