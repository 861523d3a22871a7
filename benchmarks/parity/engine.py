"""Parity of the megatron engine with HF / the torch engine on the same weights and batch.

One case = one model folder x one layout, run over gloo in ``world_size`` spawned processes::

    parent: batch, HF log-probs, torch-engine update,          workers (gloo, one per rank):
            per loss term: torch-engine gradient               MegatronTrainingEngine(layout)
            └── spawn ─────────────────────────────────────►    log-probs, HF weights (round trip),
                                                                one update, HF weights after it;
                                                                per loss term: a fresh engine's
                                                                main_grad, merged to HF tensors
    parent: compare -> ParityResult

Used by the gloo integration tests and ``benchmarks/megatron_parity.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from mindspeed_rl.models.loss.config import GRPOLossConfig
from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.engine_config import TorchEngineConfig
from mindspeed_rl.models.training.megatron.layout import MegatronLayout

LAYOUTS: dict[str, MegatronLayout] = {
    "tp2": MegatronLayout(tensor_model_parallel_size=2),
    "pp2": MegatronLayout(pipeline_model_parallel_size=2),
    "dp2": MegatronLayout(),
    "ep2": MegatronLayout(expert_model_parallel_size=2),
    # Uneven pipeline stages (upstream's num_layer_list): a 4-layer model as 1 + 3 layers, and a
    # 6-layer one over 4 stages (4 processes), which no even split holds.
    "pp2_1_3": MegatronLayout(pipeline_model_parallel_size=2, stage_layers=(1, 3)),
    "pp4_1_2_2_1": MegatronLayout(pipeline_model_parallel_size=4, stage_layers=(1, 2, 2, 1)),
}


def world_size_of(layout: MegatronLayout) -> int:
    """Processes a parity layout runs on: 2 (TP2, PP2, DP2 or EP2 inside DP2), or one per stage."""
    return max(2, layout.model_parallel_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParityResult:
    model: str
    layout: str
    logprob_max_abs_diff: float
    update_max_rel_diff: float
    roundtrip_max_abs_diff: float
    """HF weights -> megatron shards -> HF weights, before any update (0 when the mapping is exact)."""
    convert_logit_max_abs_diff: float
    """Logits of the exported HF folder loaded in transformers vs the megatron model's, after the update."""
    reference_logprob_max_abs_diff: float
    """The megatron reference model (same layout, frozen) vs the HF forward."""
    snapshot_merge_max_abs_diff: float
    """Every rank's ``snapshot_shard`` merged by the GU's rules vs the gathered HF weights (0)."""
    name_mismatches: tuple[str, ...]
    """Differences between ``megatron_names`` and the real state_dict of each rank (empty)."""
    loss_abs_diff: float
    grad_norm_rel_diff: float
    grad_max_rel_diff: dict[str, float]
    """Per loss term alone (:data:`GRAD_TERMS`): max over HF tensors of ``||g_megatron - g_torch|| /
    ||g_torch||`` (L2), the gradient the optimizer step receives (:func:`grad_rel_diffs`)."""
    grad_worst_tensor: dict[str, str]
    """Per term, the tensor that sets ``grad_max_rel_diff``."""


def parity_engine_config(*, num_samples: int) -> TorchEngineConfig:
    """One optimizer step over the whole batch, every loss term active, fp32.

    ``adam_eps`` 1e-5 rather than 1e-8: Adam's first step is ``lr * g / (|g| + eps)``, so where
    ``|g|`` is near or below eps the step amplifies fp32 summation-order noise in ``g`` by
    ``lr / eps``. Measured at eps 1e-8 on the warmed-up tiny model at TP2: one lm_head element
    (a token it never predicts) off by 17% of its step, every other element < 1e-5 of it; at
    eps 1e-6, v_proj elements with |g| ~ 1e-6 still off by 5%. The gradients themselves agree
    (grad-norm relative diff ~ 1e-7), which the parity case checks separately.
    """
    return TorchEngineConfig(
        lr=1e-3,
        adam_eps=1e-5,
        clip_grad=1e9,
        micro_batch_size=2,
        forward_micro_batch_size=3,
        mini_batch_size=num_samples,
        n_samples_per_prompt=1,
        loss=GRPOLossConfig(init_kl_coef=0.05, kl_penalty="low_var_kl", entropy_coeff=0.01),
        seed=3,
    )


def parity_batch(vocab_size: int, *, num_samples: int = 8, seed: int = 0) -> TrainBatch:
    """Ragged prompts and responses (lengths differ, so padding and masking are exercised)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab_size, size=int(rng.integers(3, 9))) for _ in range(num_samples)]
    responses = [rng.integers(0, vocab_size, size=int(rng.integers(2, 12))) for _ in range(num_samples)]
    return TrainBatch.from_lists(
        prompt_ids=prompts, response_ids=responses, advantages=rng.normal(size=num_samples).astype(np.float32)
    )


def with_behaviour_log_probs(batch: TrainBatch, log_probs: list[np.ndarray], seed: int = 1) -> TrainBatch:
    """Old log-probs = the current policy's plus noise (ratios != 1, some clipped); ref likewise."""
    rng = np.random.default_rng(seed)
    old = [lp + rng.normal(scale=0.2, size=lp.shape).astype(np.float32) for lp in log_probs]
    ref = [lp + rng.normal(scale=0.3, size=lp.shape).astype(np.float32) for lp in log_probs]
    return batch.with_log_probs(old=old, ref=ref)


GRAD_TERMS = ("policy", "kl", "entropy")
"""The loss terms whose gradients are compared one at a time (:func:`grad_term_case`)."""


def grad_term_case(
    config: TorchEngineConfig, batch: TrainBatch, term: str
) -> tuple[TorchEngineConfig, TrainBatch]:
    """``config`` and ``batch`` reduced to one loss term with coefficient 1, clipping off.

    ``policy``: KL and entropy coefficients 0. ``kl`` and ``entropy``: advantages 0, which makes
    the clipped policy term's gradient exactly 0, and the other coefficient 0. One term at a time,
    because a wrong term can hide under a larger correct one in the summed gradient (the parity
    config weighs the entropy by 0.01 and the KL by 0.05).
    """
    losses = {
        "policy": dataclasses.replace(config.loss, init_kl_coef=0.0, entropy_coeff=0.0),
        "kl": dataclasses.replace(config.loss, init_kl_coef=1.0, entropy_coeff=0.0),
        "entropy": dataclasses.replace(config.loss, init_kl_coef=0.0, entropy_coeff=1.0),
    }
    if term not in losses:
        raise ValueError(f"unknown loss term {term!r}; choose from {GRAD_TERMS}")
    if term != "policy":
        batch = dataclasses.replace(batch, advantages=np.zeros_like(batch.advantages))
    return dataclasses.replace(config, loss=losses[term], clip_grad=0.0), batch


def capture_step_grads(
    optimizer: Any, read: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Make ``optimizer.step`` record ``read()`` instead of stepping; returns the record.

    The gradient is read at the moment the engine hands it to the optimizer (after accumulation,
    the DP / TP / tied-embedding reductions and clipping): exactly what the update is computed from,
    with no optimizer non-linearity in between. Adam's first step is ``lr * g / (|g| + eps)``, about
    ``lr * sign(g)`` wherever ``|g| >> eps``, so an update comparison sees a gradient error only
    where ``|g|`` is near eps or the sign flips. Weights and optimizer state stay untouched.
    """
    record: dict[str, torch.Tensor] = {}

    def step(*args: Any, **kwargs: Any) -> None:
        if record:
            raise AssertionError("more than one optimizer step; a gradient check takes one mini-batch")
        record.update(read())

    optimizer.step = step  # an instance attribute shadows the bound method
    return record


def torch_term_grads(
    model_dir: str | os.PathLike[str], config: TorchEngineConfig, batch: TrainBatch
) -> dict[str, torch.Tensor]:
    """The torch engine's gradient of one update on ``batch``, under checkpoint names."""
    from mindspeed_rl.models.training.hf_names import tied_targets, to_checkpoint_format
    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine

    if config.param_dtype != "float32":
        # bf16 keeps the accumulated gradient on fp32 master copies, not on the parameters read here.
        raise ValueError(f"gradient check reads fp32 parameters' .grad; got param_dtype={config.param_dtype}")

    engine = TorchTrainingEngine(model_dir, config)
    model = engine.model

    def read() -> dict[str, torch.Tensor]:
        named = [
            (n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
        ]
        return {
            n: g.detach().clone().contiguous()
            for n, g in to_checkpoint_format(named, tied=tied_targets(model))
        }

    grads = capture_step_grads(engine.optimizer, read)
    engine.update(batch, temperature=0.7)
    return grads


class _Tensors:
    """Named tensors behind the ``state_dict()`` that ``gather_hf_weights`` reads."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._tensors


def _megatron_term_grads(
    model_dir: str, layout: MegatronLayout, config: TorchEngineConfig, batch: TrainBatch
) -> dict[str, torch.Tensor]:
    """A fresh engine's ``main_grad`` of one update, as full HF tensors on rank 0 (``{}`` elsewhere):
    merged from every rank's shards exactly as the weights are (``gather_hf_weights``)."""
    from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
    from mindspeed_rl.models.training.megatron.hf_export import gather_hf_weights

    engine = MegatronTrainingEngine(model_dir, config, layout)
    module = engine.model.module
    grads = capture_step_grads(
        engine.optimizer,
        lambda: {n: p.main_grad.detach().clone() for n, p in module.named_parameters() if p.requires_grad},
    )
    engine.update(batch, temperature=0.7)
    return gather_hf_weights(cast(Any, _Tensors(grads)), engine.dims, layout)


def grad_rel_diffs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor ``||got - want|| / ||want||`` (L2)."""
    if set(got) != set(want):
        raise AssertionError(f"gradient names differ: {sorted(set(got) ^ set(want))[:5]}")
    out: dict[str, float] = {}
    for name, ref in want.items():
        norm = float(ref.norm())
        err = float((got[name] - ref).norm())
        out[name] = err / norm if norm > 0 else (0.0 if err == 0 else float("inf"))
    return out


def init_gloo(rank: int, world_size: int, port: int) -> None:
    """A spawned worker's process group on this host: gloo, one torch thread (2 ranks, 2 cores)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    port: int,
    model_dir: str,
    layout: MegatronLayout,
    out_dir: str,
    config: TorchEngineConfig,
    grad_cases: dict[str, tuple[TorchEngineConfig, TrainBatch]],
) -> None:
    import torch.distributed as dist

    init_gloo(rank, world_size, port)
    try:
        from mindspeed_rl.models.training.megatron.engine import MegatronTrainingEngine
        from mindspeed_rl.models.training.megatron.reference import MegatronReferenceModel

        batch: TrainBatch = torch.load(Path(out_dir) / "batch.pt", weights_only=False)
        engine = MegatronTrainingEngine(model_dir, config, layout)
        result: dict[str, Any] = {"log_probs": engine.compute_log_probs(batch, temperature=0.7)}
        result["name_mismatches"] = _gather_name_mismatches(engine)
        reference = MegatronReferenceModel(model_dir, layout, micro_batch_size=2)
        result["ref_log_probs"] = reference.compute_log_probs(batch, temperature=0.7)
        result["weights_before"] = dict(engine.named_weights_for_inference())
        result["metrics"] = engine.update(batch, temperature=0.7)
        result["weights_after"] = dict(engine.named_weights_for_inference())
        result["logits"] = _full_logits(engine, convert_check_ids(engine.dims.vocab_size))
        shards: list[Any] = [None] * world_size
        dist.all_gather_object(shards, engine.snapshot_shard())
        result["snapshot_shards"] = shards
        engine.save_hf(Path(out_dir) / "converted")
        result["grads"] = {
            term: _megatron_term_grads(model_dir, layout, term_config, term_batch)
            for term, (term_config, term_batch) in grad_cases.items()
        }
        if rank == 0:
            torch.save(result, Path(out_dir) / "result.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def convert_check_ids(vocab_size: int) -> torch.Tensor:
    """Fixed token ids ``[3, 10]`` for comparing full logits of megatron and transformers."""
    return torch.from_numpy(np.random.default_rng(7).integers(0, vocab_size, size=(3, 10)))


def _full_logits(engine: Any, ids: torch.Tensor) -> torch.Tensor:
    """``[B, S, vocab]`` logits of the megatron model (TP-gathered: a check, not a training path)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.training.megatron.forward import Micro, plan_micros, run_micros

    rows = [r.numpy() for r in ids]
    batch = TrainBatch.from_lists(
        prompt_ids=[r[:-1] for r in rows], response_ids=[r[-1:] for r in rows], advantages=np.zeros(len(rows))
    )
    micros = plan_micros(
        batch,
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
        micro_batch_size=len(rows),
        pad_token_id=0,
        device=torch.device("cpu"),
    )

    def loss_fn(
        micro: Micro, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        full = gather_from_tensor_model_parallel_region(logits)[..., : engine.dims.vocab_size]
        return logits.sum() * 0.0, torch.tensor(1), {"logits": full.detach()}

    with torch.no_grad():
        outputs = run_micros(engine.model, micros, loss_fn, forward_only=True)
    local = {}
    if ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0:
        for micro, out in zip(micros, outputs, strict=True):
            local.update({int(i): out["logits"][row] for row, i in enumerate(micro.indices)})
    gathered: list[dict[int, torch.Tensor] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged = {k: v for part in gathered for k, v in (part or {}).items()}
    return torch.stack([merged[i] for i in range(len(rows))])


def _gather_name_mismatches(engine: Any) -> list[str]:
    """Per rank, names in the real ``state_dict`` but not in ``megatron_names`` and vice versa."""
    import torch.distributed as dist

    from mindspeed_rl.models.training.megatron.model import rank_coords
    from mindspeed_rl.models.training.megatron.param_names import is_weight_name, megatron_names

    real = {n for n in engine.model.module.state_dict() if is_weight_name(n)}
    expected = set(megatron_names(engine.dims, rank_coords(engine.layout)))
    mine = [f"rank {dist.get_rank()}: {n}" for n in sorted(real ^ expected)]
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [m for part in gathered for m in part or []]


def run_megatron_side(
    model_dir: str | os.PathLike[str],
    layout: MegatronLayout,
    batch: TrainBatch,
    config: TorchEngineConfig | None = None,
    grad_cases: dict[str, tuple[TorchEngineConfig, TrainBatch]] | None = None,
    keep_export: Path | None = None,
) -> dict[str, Any]:
    """Run the megatron engine over gloo in spawned processes (``world_size_of``); return rank 0's
    results. ``keep_export``: where to copy the HF folder the engine exported after its update.

    ``grad_cases``: ``{term: (config, batch)}`` of :func:`grad_term_case`; each runs one update of a
    fresh engine whose gradient is returned under ``result["grads"][term]`` (HF names, full shapes).
    """
    from benchmarks.parity import ranks

    with tempfile.TemporaryDirectory(prefix="megatron-parity-") as tmp:
        torch.save(batch, Path(tmp) / "batch.pt")
        config = config or parity_engine_config(num_samples=batch.num_samples)
        world = world_size_of(layout)
        args = (world, free_port(), os.fspath(model_dir), layout, tmp, config, grad_cases or {})
        ranks.start_ranks(_worker, args, world)
        result = dict(torch.load(Path(tmp) / "result.pt", weights_only=False))
        result["hf_logits"] = _transformers_logits(Path(tmp) / "converted", result["logits"].shape[-1])
        if keep_export is not None:
            shutil.copytree(Path(tmp) / "converted", keep_export)
        return result


def _transformers_logits(model_dir: Path, vocab_size: int) -> torch.Tensor:
    """Logits of the converted HF folder, loaded the way every consumer loads it."""
    from mindspeed_rl.models.training.reference import load_causal_lm

    model = load_causal_lm(model_dir, "cpu")
    with torch.no_grad():
        out = model(input_ids=convert_check_ids(vocab_size), use_cache=False)
    return out.logits[..., :vocab_size].float()


def update_rel_diffs(
    before: dict[str, torch.Tensor], got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Per tensor ``||got - want|| / ||want - before||`` (L2): the error relative to the step taken.

    L2 rather than elementwise: Adam's first step is about ``lr * sign(g)``, so an element whose
    gradient is ~0 (round-off in both engines) can flip sign without the update being wrong.
    """
    out: dict[str, float] = {}
    for name, ref in want.items():
        step = float((ref - before[name]).norm())
        err = float((got[name] - ref).norm())
        out[name] = err / step if step > 0 else (0.0 if err == 0 else float("inf"))
    return out


def merge_snapshot_shards(shards: list[Any], dims: Any, layout: MegatronLayout) -> dict[str, torch.Tensor]:
    """What the GU's convert does with the per-rank snapshot shards of one layout (DP rank 0's)."""
    from mindspeed_rl.weights import megatron_rules
    from mindspeed_rl.weights.merge import Piece, apply_name_map, merge_pieces

    tl = megatron_rules.training_layout(
        tp_size=layout.tensor_model_parallel_size,
        pp_size=layout.pipeline_model_parallel_size,
        ep_size=layout.expert_model_parallel_size,
    )
    pieces, seen = [], set()
    for tensors, coords in shards:
        rank = megatron_rules.rank_coords(coords)
        if rank in seen:  # another DP replica of the same shard
            continue
        seen.add(rank)
        for name, tensor in tensors.items():
            spec = tl.spec_for(name)
            if tl.writes(spec, rank):
                pieces.append(Piece(name=name, tensor=tensor, spec=spec, coords=rank))
    renamed = apply_name_map(pieces, megatron_rules.name_map(dims, tp_size=tl.tp_size))
    return megatron_rules.trim_vocab_padding(
        merge_pieces(renamed, tp_size=tl.tp_size, ep_size=tl.ep_size), dims
    )


def run_parity_case(
    model_dir: str | os.PathLike[str], layout_name: str, *, keep_export: Path | None = None
) -> ParityResult:
    """Compare the megatron engine at ``layout_name`` with HF log-probs and the torch engine's update."""
    from safetensors.torch import load_file

    from mindspeed_rl.models.training.torch_engine import TorchTrainingEngine
    from mindspeed_rl.weights.megatron_dims import load_dims

    if layout_name not in LAYOUTS:
        raise ValueError(f"unknown layout {layout_name!r}; choose from {sorted(LAYOUTS)}")
    dims = load_dims(model_dir)
    batch = parity_batch(dims.vocab_size)
    config = parity_engine_config(num_samples=batch.num_samples)
    torch_engine = TorchTrainingEngine(model_dir, config)
    hf_log_probs = torch_engine.compute_log_probs(batch, temperature=0.7)
    batch = with_behaviour_log_probs(batch, hf_log_probs)
    before = {k: v.clone() for k, v in torch_engine.named_weights_for_inference()}
    torch_metrics = torch_engine.update(batch, temperature=0.7)
    want = dict(torch_engine.named_weights_for_inference())
    grad_cases = {term: grad_term_case(config, batch, term) for term in GRAD_TERMS}
    torch_grads = {term: torch_term_grads(model_dir, *case) for term, case in grad_cases.items()}
    meg = run_megatron_side(model_dir, LAYOUTS[layout_name], batch, config, grad_cases, keep_export)
    grad_diffs = {term: grad_rel_diffs(meg["grads"][term], torch_grads[term]) for term in GRAD_TERMS}
    convert_diff = float((meg["hf_logits"] - meg["logits"]).abs().max())
    merged = merge_snapshot_shards(meg["snapshot_shards"], dims, LAYOUTS[layout_name])
    snapshot_diff = max(float((merged[k] - v).abs().max()) for k, v in meg["weights_after"].items())
    if set(merged) != set(meg["weights_after"]):
        raise AssertionError(f"snapshot merge names differ: {set(merged) ^ set(meg['weights_after'])}")
    files = sorted(Path(model_dir).glob("*.safetensors"))
    original = {k: v for f in files for k, v in load_file(str(f)).items()}
    if dims.tied_embeddings:
        original.pop("lm_head.weight", None)
    roundtrip = max(float((meg["weights_before"][k] - v.float()).abs().max()) for k, v in original.items())
    if set(meg["weights_before"]) != set(original):
        raise AssertionError(
            f"HF names differ after the round trip: {set(meg['weights_before']) ^ set(original)}"
        )
    want = {k: v for k, v in want.items() if k in original}
    return ParityResult(
        model=Path(model_dir).name,
        layout=layout_name,
        logprob_max_abs_diff=max(float(np.abs(a - b).max()) for a, b in zip(meg["log_probs"], hf_log_probs)),
        reference_logprob_max_abs_diff=max(
            float(np.abs(a - b).max()) for a, b in zip(meg["ref_log_probs"], hf_log_probs)
        ),
        update_max_rel_diff=max(update_rel_diffs(before, meg["weights_after"], want).values()),
        roundtrip_max_abs_diff=roundtrip,
        convert_logit_max_abs_diff=convert_diff,
        snapshot_merge_max_abs_diff=snapshot_diff,
        name_mismatches=tuple(meg["name_mismatches"]),
        loss_abs_diff=abs(meg["metrics"]["loss"] - torch_metrics["loss"]),
        grad_norm_rel_diff=abs(meg["metrics"]["grad_norm"] / torch_metrics["grad_norm"] - 1.0),
        grad_max_rel_diff={term: max(d.values()) for term, d in grad_diffs.items()},
        grad_worst_tensor={term: max(d, key=d.__getitem__) for term, d in grad_diffs.items()},
    )
