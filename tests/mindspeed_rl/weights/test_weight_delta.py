"""Delta weight sync (``weights/delta.py``): 20 versions of delta, each compared bit for bit with
the trainer's weights, for a dense, a tied-embedding and a MoE model, identity and TP2 -> TP1 /
EP2xTP2 -> 1 merges; a corrupted delta is named and recovered by a full resend.

Each refresh crosses the wire form every transport carries (``pack`` -> bytes -> ``unpack``); the
GU merges the applied rank copies with the real merge code (``merge.merge_pieces``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.weights.delta import (
    BaseMismatch,
    DeltaEncoder,
    DeltaLink,
    DeltaMismatch,
    DeltaReceiver,
    DeltaRefresh,
    TensorDelta,
)
from mindspeed_rl.weights.delta_wire import pack, unpack
from mindspeed_rl.weights.layout import PartitionRule, PartitionSpec, TrainingLayout, hf_dense_rules
from mindspeed_rl.weights.merge import Piece, merge_pieces

VERSIONS = 20
CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _wire(refresh: DeltaRefresh) -> DeltaRefresh:
    return unpack(pack(refresh))


def _dense(gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, f, v = 16, 24, 32
    return {
        "model.embed_tokens.weight": torch.randn(v, h, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(h, h, generator=gen),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(h, h, generator=gen),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(f, h, generator=gen),
        "model.layers.0.mlp.down_proj.weight": torch.randn(h, f, generator=gen),
        "model.norm.weight": torch.rand(h, generator=gen),
        "lm_head.weight": torch.randn(v, h, generator=gen),
    }


def _moe(gen: torch.Generator) -> dict[str, torch.Tensor]:
    full = {
        f"model.layers.0.mlp.experts.{e}.gate_proj.weight": torch.randn(8, 6, generator=gen) for e in range(4)
    }
    full["model.layers.0.mlp.grouped_experts.fc1"] = torch.randn(4, 8, 6, generator=gen)
    full["model.layers.0.mlp.gate.weight"] = torch.randn(4, 6, generator=gen)  # router: replicated
    full["model.norm.weight"] = torch.rand(6, generator=gen)
    return full


MOE_LAYOUT = TrainingLayout(
    tp_size=2,
    ep_size=2,
    rules=(
        PartitionRule(pattern=r"grouped_experts\.fc1$", spec=PartitionSpec(ep_dim=0, tp_dim=1)),
        *hf_dense_rules(),
    ),
)
TP2 = TrainingLayout(tp_size=2, rules=hf_dense_rules())
TP1 = TrainingLayout()


def _rank_tensors(
    layout: TrainingLayout, full: dict[str, torch.Tensor], rank: int
) -> dict[str, torch.Tensor]:
    """What a training rank exports: its TP/EP chunk; per-expert names only on their EP rank;
    a replicated tensor by coordinate 0 only (``TrainingLayout.writes``, as the real exporter)."""
    coords = layout.coords(rank)
    per_ep = 4 // layout.ep_size
    out = {}
    for name, tensor in full.items():
        if ".experts." in name and int(name.split(".experts.")[1].split(".")[0]) // per_ep != coords.ep_rank:
            continue
        spec = layout.spec_for(name)
        if not layout.writes(spec, coords):
            continue
        t = tensor
        if spec.ep_dim is not None:
            t = t.chunk(layout.ep_size, dim=spec.ep_dim)[coords.ep_rank]
        if spec.tp_dim is not None:
            t = t.chunk(layout.tp_size, dim=spec.tp_dim)[coords.tp_rank]
        out[name] = t.contiguous()
    return out


class Trainer:
    """fp32 master weights stepped by small sparse-ish updates, exported in bf16 (the RL case:
    most bf16 words do not change per step). ``tied``: lm_head is embed_tokens' storage."""

    def __init__(self, make: Callable[[torch.Generator], dict[str, torch.Tensor]], *, tied: bool) -> None:
        self.gen = torch.Generator().manual_seed(7)
        self.master = make(self.gen)
        if tied:
            self.master["lm_head.weight"] = self.master["model.embed_tokens.weight"]
        self.tied = tied

    def step(self) -> None:
        seen: set[int] = set()
        for tensor in self.master.values():
            if id(tensor) in seen:
                continue  # a tied tensor is stepped once
            seen.add(id(tensor))
            update = 3e-3 * torch.randn(tensor.shape, generator=self.gen)
            tensor.add_(update * (torch.rand(tensor.shape, generator=self.gen) < 0.3))

    def export(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in self.master.items():
            out[name] = t.to(torch.bfloat16) if name != "model.norm.weight" else t.clone()  # bf16 + fp32
        return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _merged(layout: TrainingLayout, receivers: list[DeltaReceiver]) -> dict[str, torch.Tensor]:
    pieces = [
        Piece(name=name, tensor=tensor, spec=layout.spec_for(name), coords=layout.coords(rank))
        for rank, receiver in enumerate(receivers)
        for name, tensor in receiver.tensors().items()
    ]
    return merge_pieces(pieces, tp_size=layout.tp_size, ep_size=layout.ep_size)


@pytest.mark.parametrize(
    ("model", "layout"),
    [
        pytest.param("dense", TP1, id="dense-identity"),
        pytest.param("dense", TP2, id="dense-tp2_to_tp1"),
        pytest.param("tied", TP1, id="tied-identity"),
        pytest.param("tied", TP2, id="tied-tp2_to_tp1"),
        pytest.param("moe", MOE_LAYOUT, id="moe-ep2tp2_to_1"),
    ],
)
def test_twenty_delta_versions_are_bit_exact(model: str, layout: TrainingLayout) -> None:
    trainer = Trainer(_moe if model == "moe" else _dense, tied=model == "tied")
    links = [
        DeltaLink(DeltaEncoder("on", full_interval=8), DeltaReceiver()) for _ in range(layout.world_size)
    ]
    for version in range(1, VERSIONS + 1):
        trainer.step()
        full = trainer.export()
        for rank, link in enumerate(links):
            link.refresh(version, _rank_tensors(layout, full, rank), _wire)
        got = _merged(layout, [link.receiver for link in links])
        assert sorted(got) == sorted(full)
        for name, tensor in full.items():
            assert got[name].dtype == tensor.dtype and torch.equal(_bits(got[name]), _bits(tensor)), (
                version,
                name,
            )
        if trainer.tied:
            assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])
    for link in links:
        stats = link.stats
        # Full at versions 1, 9, 17 (every 8); every other refresh a delta, and smaller.
        assert stats.full_refreshes == 3 and stats.refreshes == VERSIONS and stats.resends == 0
        assert 0 < stats.bytes_sent < stats.full_bytes
        summary = stats.as_summary()
        assert 0 < summary["delta_changed_fraction"] < 1


def test_a_corrupted_delta_is_named_and_recovered_by_a_full_resend(caplog: pytest.LogCaptureFixture) -> None:
    trainer = Trainer(_dense, tied=False)
    link = DeltaLink(DeltaEncoder("on", full_interval=100), DeltaReceiver())
    corrupt_at = 5

    def flip(refresh: DeltaRefresh) -> DeltaRefresh:
        out = _wire(refresh)
        if refresh.version != corrupt_at or refresh.is_full:
            return out
        part = next(p for p in out.tensors if p.name == "model.layers.0.mlp.gate_proj.weight")
        part.data[0] ^= 1  # one bit of one carried word
        return out

    with caplog.at_level(logging.ERROR, logger="mindspeed_rl.weights.delta"):
        for version in range(1, 9):
            trainer.step()
            full = trainer.export()
            metrics = link.refresh(version, full, flip)
            got = link.receiver.tensors()
            for name, tensor in full.items():
                assert torch.equal(_bits(got[name]), _bits(tensor)), (version, name)
            if version == corrupt_at:
                assert metrics["delta_full"] == 1.0
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1
    assert "v5" in errors[0] and "tensor model.layers.0.mlp.gate_proj.weight" in errors[0]
    assert link.stats.resends == 1 and link.stats.full_refreshes == 2  # v1 and the resend


def test_a_mismatch_raises_naming_tensor_and_version_and_drops_the_base() -> None:
    encoder, receiver = DeltaEncoder("on"), DeltaReceiver()
    w = {"a": torch.zeros(4, dtype=torch.bfloat16), "b": torch.ones(3)}
    receiver.apply(encoder.encode(1, w.items(), receiver.base_version))
    w["b"] = torch.tensor([1.0, 2.0, 1.0])
    sent = encoder.encode(2, w.items(), receiver.base_version)
    assert not sent.is_full and [p.encoding for p in sent.tensors] == ["sparse", "sparse"]
    bad = sent.tensors[1]
    wrong = TensorDelta(
        name=bad.name, dtype=bad.dtype, shape=bad.shape, encoding="sparse", checksum=bad.checksum,
        data=np.array([0], dtype=bad.data.dtype), indices=np.array([0], dtype=np.uint16),
        blocks=np.array([1], dtype=np.uint32),
    )  # fmt: skip
    with pytest.raises(DeltaMismatch, match=r"v2: tensor b does not match"):
        receiver.apply(DeltaRefresh(**{**_fields(sent), "tensors": (sent.tensors[0], wrong)}))
    assert receiver.base_version is None, "the copy is dropped: the next ask is for a full refresh"
    assert encoder.encode(3, w.items(), receiver.base_version).is_full


def _fields(refresh: DeltaRefresh) -> dict[str, object]:
    return {f: getattr(refresh, f) for f in DeltaRefresh.__dataclass_fields__}


def test_a_delta_on_a_base_the_receiver_lacks_is_refused() -> None:
    encoder, receiver = DeltaEncoder("on"), DeltaReceiver()
    w = {"a": torch.arange(6, dtype=torch.float32)}
    receiver.apply(encoder.encode(1, w.items(), None))
    w["a"][0] = 9
    sent = encoder.encode(2, w.items(), receiver.base_version)
    fresh = DeltaReceiver()  # a restarted GU: no base
    with pytest.raises(BaseMismatch, match="v2: a delta on v1, but this receiver holds nothing"):
        fresh.apply(sent)


def test_full_when_the_base_is_unknown_or_not_the_encoders() -> None:
    encoder = DeltaEncoder("on", full_interval=50)
    w = {"a": torch.arange(8, dtype=torch.float32)}
    assert encoder.encode(1, w.items(), None).is_full
    assert not encoder.encode(2, w.items(), 1).is_full
    assert encoder.encode(3, w.items(), 1).is_full, "a receiver on an older base gets a full refresh"
    assert encoder.encode(4, w.items(), None).is_full, "a receiver that lost its base asks for one"


def test_auto_sends_a_delta_only_when_small_and_off_always_full() -> None:
    w = {"a": torch.zeros(1000, dtype=torch.bfloat16)}
    auto, off = DeltaEncoder("auto"), DeltaEncoder("off")
    for enc in (auto, off):
        enc.encode(1, w.items(), None)
    w["a"][:5] = 1.0
    assert not auto.encode(2, w.items(), 1).is_full
    assert off.encode(2, w.items(), 1).is_full
    w["a"] += 1.0  # every element changes: a delta would cost 3x the full bytes
    assert auto.encode(3, w.items(), 2).is_full


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="async_config.weight_delta='sometimes'"):
        DeltaEncoder("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="async_config.delta_full_interval=0"):
        DeltaEncoder("on", full_interval=0)


def test_sparse_indices_past_one_index_block_round_trip() -> None:
    """Indices are carried as 16-bit low parts plus per-65536-block counts: changes spread over
    several blocks (and a tensor of a partial last block) land where they were."""
    encoder, receiver = DeltaEncoder("on"), DeltaReceiver()
    w = {"big": torch.zeros(3 * 65536 + 123, dtype=torch.bfloat16)}
    receiver.apply(_wire(encoder.encode(1, w.items(), None)))
    w["big"][[0, 65535, 65536, 2 * 65536 + 7, 3 * 65536 + 122]] = torch.tensor(
        [1.0, 2.0, 3.0, 4.0, 5.0]
    ).bfloat16()
    sent = encoder.encode(2, w.items(), 1)
    assert not sent.is_full and sent.tensors[0].nbytes == 5 * 2 + 5 * 2 + 4 * 4
    receiver.apply(_wire(sent))
    assert torch.equal(_bits(receiver.tensors()["big"]), _bits(w["big"]))


def test_the_wire_form_keeps_every_bit() -> None:
    encoder = DeltaEncoder("on")
    w = {
        "bf16": torch.tensor([0.0, -0.0, float("nan"), 1.5], dtype=torch.bfloat16),
        "i64": torch.tensor([1, 2, 3]),
        "f16": torch.randn(5).half(),
    }
    sent = encoder.encode(1, w.items(), None)
    back = unpack(pack(sent))
    receiver = DeltaReceiver()
    receiver.apply(back)
    for name, tensor in w.items():
        assert torch.equal(_bits(receiver.tensors()[name]), _bits(tensor)), name


def test_the_plan_carries_delta_on_every_transport() -> None:
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.weights.transports import DeltaSettings

    def plan(*overrides: str) -> object:
        return build_run_plan(load_config_from_files(CONFIGS, "grpo_tiny_asp", list(overrides)))

    off = plan("async_config.weight_delta=off")
    assert off.async_spec.weight_delta is None  # type: ignore[attr-defined]
    on = plan("async_config.weight_delta=on", "async_config.delta_full_interval=4")
    assert on.async_spec.weight_delta == DeltaSettings(mode="on", full_interval=4)  # type: ignore[attr-defined]
    carried = plan("async_config.weight_delta=on", "async_config.weight_transport=object_store")
    assert carried.async_spec.weight_delta == DeltaSettings(mode="on", full_interval=10)  # type: ignore[attr-defined]
    collective = plan("async_config.weight_delta=auto", "async_config.weight_transport=collective")
    assert collective.async_spec.weight_delta == DeltaSettings(mode="auto", full_interval=10)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="async_config.delta_full_interval=0"):
        plan("async_config.delta_full_interval=0")
