"""MoE routing replay in the megatron engine (megatron-core 0.19.2's router replay) over gloo,
against the torch engine replaying the same record (real models and engines, no stand-ins).

The record is one the routers would not choose (random expert sets), so routing that merely
agrees with the routers' own choice cannot pass. Per layout (EP2 inside DP2, PP2): the log-prob
pass routes every (position, layer) row as recorded and scores like the torch engine; the
reference does too; one update replaying the record steps the weights like the torch engine's;
without a record the pass captures the routers' own choice (R2's record), the torch engine's.
TP2 trains only with sequence parallelism (megatron's MoE layer refuses TP > 1 without it in
training), which the CPU (local) layer spec cannot build (its torch RMSNorm refuses it), so
``layout.check_trainable`` refuses MoE at TP2 on CPU. The narrowest stand-in: that refusal
switched off and the TP2 model (no SP) used forward only, which megatron allows: the log-prob and
reference passes at TP2, where both TP ranks route the same tokens. The SP split of the record
is checked without megatron in ``test_sequence_parallel_positions``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.parity.engine import (
    LAYOUTS,
    free_port,
    init_gloo,
    parity_batch,
    parity_engine_config,
    update_rel_diffs,
    with_behaviour_log_probs,
)
from benchmarks.parity.models import build_parity_model
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig


def _has_router_replay() -> bool:
    """Whether this megatron-core carries ``transformer/moe/router_replay.py`` (0.19.2 does;
    MindSpeed's 0.12.1, run by ``make test-mcore012``, does not, and the plan refuses replay there).
    Looked up by file: importing megatron at collection would slow every test tier."""
    spec = importlib.util.find_spec("megatron.core")
    return (
        spec is not None
        and spec.origin is not None
        and (Path(spec.origin).parent / "transformer" / "moe" / "router_replay.py").is_file()
    )


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core not installed (make setup installs it)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is not None and not _has_router_replay(),
        reason="this megatron-core has no router replay (0.19.2 added it; MindSpeed's 0.12.1 lacks it)",
    ),
]

NUM_EXPERTS, TOP_K, LAYERS = 4, 2, 2  # build_parity_model's qwen3_moe


def _random_routing(batch: TrainBatch, seed: int = 5) -> TrainBatch:
    rng = np.random.default_rng(seed)
    rows = []
    for p, r in zip(batch.prompt_ids, batch.response_ids):
        n = p.size + r.size - 1
        picks = [[np.sort(rng.permutation(NUM_EXPERTS)[:TOP_K]) for _ in range(LAYERS)] for _ in range(n)]
        rows.append(np.asarray(picks, dtype=np.int64))
    return batch.with_routing(rows)


def _worker(rank: int, world: int, port: int, model_dir: str, layout_name: str, tmp: str) -> None:
    import contextlib
    from unittest import mock

    import torch.distributed as dist

    init_gloo(rank, world, port)
    forward_only = layout_name == "tp2"
    stack = contextlib.ExitStack()
    if forward_only:  # the stand-in of the module docstring
        stack.enter_context(mock.patch("mindspeed_rl.models.training.megatron.model.check_trainable"))
    try:
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel

        inputs = torch.load(Path(tmp) / "inputs.pt", weights_only=False)
        layout = LAYOUTS[layout_name]
        engine = MegatronTrainingEngine(model_dir, inputs["config"], layout)
        out: dict[str, Any] = {}
        out["logp"], out["used"], out["metrics"] = engine.compute_log_probs_and_routing(
            inputs["replayed"], temperature=0.7
        )
        _, out["natural"], _ = engine.compute_log_probs_and_routing(inputs["plain"], temperature=0.7)
        reference = MegatronReferenceModel(model_dir, layout, micro_batch_size=2)
        out["ref_logp"] = reference.compute_log_probs(inputs["replayed"], temperature=0.7)
        if not forward_only:
            out["update_metrics"] = engine.update(inputs["train"], temperature=0.7)
            out["weights_after"] = dict(engine.named_weights_for_inference())
        if rank == 0:
            torch.save(out, Path(tmp) / "out.pt")
        dist.barrier()
    finally:
        stack.close()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_parity_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout_name", ["ep2", "pp2", "tp2"])
def test_megatron_replays_the_record_like_the_torch_engine(moe_dir: Path, layout_name: str) -> None:
    from benchmarks.parity import ranks
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    plain = parity_batch(100, num_samples=8)
    replayed = _random_routing(plain)
    config: TorchEngineConfig = parity_engine_config(num_samples=plain.num_samples)
    torch_engine = TorchTrainingEngine(moe_dir, config)
    want_logp, want_used, want_metrics = torch_engine.compute_log_probs_and_routing(replayed, 0.7)
    _, want_natural, _ = torch_engine.compute_log_probs_and_routing(plain, 0.7)
    train = with_behaviour_log_probs(replayed, want_logp)
    # Copies: on CPU in fp32 these are the live parameters, which the update steps in place.
    before = {n: t.clone() for n, t in torch_engine.named_weights_for_inference()}
    torch_engine.update(train, temperature=0.7)
    want_after = dict(torch_engine.named_weights_for_inference())
    # The record is not the routers' choice: without replay most rows would route otherwise.
    assert want_metrics["routing/recompute_router_disagree_frac"] > 0.3

    with tempfile.TemporaryDirectory(prefix="megatron-replay-") as tmp:
        torch.save(
            {"config": config, "plain": plain, "replayed": replayed, "train": train}, Path(tmp) / "inputs.pt"
        )
        ranks.start_ranks(_worker, (2, free_port(), os.fspath(moe_dir), layout_name, tmp), 2)
        got = torch.load(Path(tmp) / "out.pt", weights_only=False)

    for i, rows in enumerate(replayed.routing or ()):
        np.testing.assert_array_equal(got["used"][i], rows, err_msg=f"sample {i}")
        # The torch engine keeps the router's top-k order; the sets are what replay reproduces.
        natural = np.sort(want_natural[i], axis=-1)
        np.testing.assert_array_equal(got["natural"][i], natural, err_msg=f"sample {i} (no replay)")
        np.testing.assert_array_equal(np.sort(want_used[i], axis=-1), rows)
    for i in range(plain.num_samples):
        np.testing.assert_allclose(got["logp"][i], want_logp[i], atol=1e-4, err_msg=f"sample {i}")
        np.testing.assert_allclose(got["ref_logp"][i], want_logp[i], atol=1e-4, err_msg=f"ref {i}")
    rows_total = sum(r.shape[0] * LAYERS for r in replayed.routing or ())
    assert got["metrics"]["routing/recompute_replayed_rows"] == rows_total
    assert got["metrics"]["routing/recompute_router_disagree_frac"] == pytest.approx(
        want_metrics["routing/recompute_router_disagree_frac"]
    )
    if layout_name == "tp2":
        return  # forward only (module docstring)
    assert got["update_metrics"]["routing/train_replayed_rows"] == rows_total
    diffs = update_rel_diffs(before, got["weights_after"], want_after)
    assert max(diffs.values()) <= 1e-3, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]


def test_sequence_parallel_positions() -> None:
    """Under sequence parallelism TP rank r's routers see the r-th contiguous chunk of positions,
    sequence-major ([S/tp, B] flattened), which ``_targets`` lays the record out as."""
    from unittest import mock

    from mindspeed_rl.models.training.megatron import routing_replay

    config = dataclasses.make_dataclass("C", [("sequence_parallel", bool)])(True)
    with (
        mock.patch("megatron.core.parallel_state.get_tensor_model_parallel_world_size", return_value=2),
        mock.patch("megatron.core.parallel_state.get_tensor_model_parallel_rank", return_value=1),
        mock.patch.object(routing_replay.context_parallel, "local_positions", return_value=None),
    ):
        positions = routing_replay.local_positions(6, torch.device("cpu"), config)
    assert positions.tolist() == [3, 4, 5]
    record = torch.arange(2 * 3 * 2).reshape(2, 3, 2)  # [B=2, S_local=3, K=2]
    record[1, 2] = -1
    targets = routing_replay._targets(record)
    # token t = s * B + b; the unrecorded row gets experts 0..K-1
    assert targets.tolist() == [[0, 1], [6, 7], [2, 3], [8, 9], [4, 5], [0, 1]]


def test_filler_rows_carry_no_record_and_real_rows_keep_theirs() -> None:
    """A DP rank short of rows fills its micro-batch with one-token rows: their routing is -1 (no
    record), the real rows' records travel with them."""
    from mindspeed_rl.models.training.megatron.forward import plan_micros

    batch = _random_routing(parity_batch(100, num_samples=3))
    micros = plan_micros(
        batch, dp_rank=1, dp_size=2, micro_batch_size=2, pad_token_id=0, device=torch.device("cpu")
    )
    rows = [r for m in micros for r in m.batch.routing or ()]
    real = [int(i) for m in micros for i in m.indices]
    assert len(rows) == 2 and len(real) == 1
    np.testing.assert_array_equal(rows[0], (batch.routing or ())[real[0]])
    assert rows[1].shape == (1, LAYERS, TOP_K) and (rows[1] == -1).all()
