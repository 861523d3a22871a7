"""The async pipeline with ``weight_delta: on`` (shared_fs, object_store, collective) end to end: real CLI, real Ray, the
light HF engine, the tiny config of ``test_async_e2e``. Every prompt is consumed once, the
refreshes travel as deltas (the summary's and the metrics' delta figures), and what the GUs
converted for their actors is, bit for bit, the trainer's final weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_async_e2e as base  # the tiny run's settings, CLI runner and invariant checks
import torch
from safetensors.torch import load_file

from mindspeed_rl.weights.store import latest_published
from tests.support.models import PolicyModels

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# (GUs, actors per GU, fault plan, transport). shared_fs runs the fault run of ``test_async_e2e``
# (GU 0 exits after forwarding one completion, actor 0 of GU 1 in its first minibatch: a
# replacement actor starts and loads the GU's converted folder, a full copy). It makes every
# check the plain shared_fs run (1 GU x 2 actors) made, on the surviving GU: that run merged
# into it.
RUNS = {
    "gu_and_actor_killed": (2, 2, "gu:0:1,actor:1:0:1", "shared_fs"),
    # The deltas in Ray's object store (weights/delta_object_store.py): the TU's handles carry
    # the chains, the GU finds the run's board by name from its own process.
    "object_store": (1, 2, "", "object_store"),
    # The deltas over the GU's gloo group (weights/delta_collective.py): the GU answers each TU
    # rank with the version it holds, from its own process.
    "collective": (1, 2, "", "collective"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_async_run_with_delta_on_is_exact_and_loses_nothing(
    tmp_path: Path, policy_models: PolicyModels, name: str
) -> None:
    gus, actors, faults, transport = RUNS[name]
    policy_models.provide(tmp_path / "model", "grpo_tiny_asp", base.TINY)
    run_dir = base.run_cli(
        tmp_path,
        *base.HF,
        f"async_config.num_generation_units={gus}",
        f"async_config.actors_per_unit={actors}",
        "async_config.weight_delta=on",
        f"async_config.weight_transport={transport}",
        f"async_config.delta_full_interval={3 if transport == 'shared_fs' else 100}",
        "async_config.snapshot_keep=4",
        *(base.FAULT_TIMEOUTS if faults else ()),
        faults=faults,
    )
    summary, records, events = base.load_run(run_dir)
    base.check_exactly_once(summary)
    received = [e for e in events if e["event"] == "MinibatchReceived" and e["outcome"] == "accepted"]
    assert len({e["minibatch_id"] for e in received}) == len(received) == 8  # each minibatch once
    assert base.check_reload_discipline(events) > 0
    if transport == "shared_fs":
        # The TU wrote v1..v4 but for an export superseded while queued (a slow first encode: a
        # fresh checkout compiles the codec's loops there); full at v1 and v4 (every 3) either way.
        assert summary["delta_refreshes"] + summary["snapshot_exports_superseded"] == 4
        assert summary["delta_full_refreshes"] == 2
    else:
        # The first publish starts the run's board actor: an export queued meanwhile may be
        # superseded (never encoded, never a link). Full only at v1 here (interval 100).
        assert summary["delta_refreshes"] + summary["snapshot_exports_superseded"] == 4
        assert summary["delta_full_refreshes"] == 1 < summary["delta_refreshes"]
    # Bytes are not compared with the full ones here: at the tiny demo's learning rate most
    # elements change every step, so a delta is not smaller (``auto`` would send it full);
    # ``snapshot_io.py --delta`` measures the savings at RL learning rates.
    assert summary["delta_bytes_sent"] > 0 and summary["delta_full_bytes"] > 0
    assert summary["delta_resends"] == 0 and summary["delta_apply_seconds"] > 0
    conversions = [e for e in events if e["event"] == "SnapshotConverted" and e.get("delta")]
    assert conversions and all(e["delta"]["delta_refreshes_applied"] >= 1 for e in conversions)
    if transport != "shared_fs":  # no file: what the TU put or sent is the packed refreshes
        sent = "object_store_bytes_put" if transport == "object_store" else "collective_bytes_sent"
        assert summary[sent] > 0
        # Its versions were published and converted late in this short run: a conversion after
        # the last step is in events.jsonl, not in a step's metrics record.
        return
    # A step's record carries the refreshes the GUs converted before it ended; when generation runs
    # ahead of a late trainer, every conversion can come after the last step (events.jsonl only).
    last_step = max(e["time"] for e in events if e["event"] == "TrainStepDone")
    if any(e["time"] <= last_step for e in conversions):
        assert any("delta/bytes_sent" in r and r["delta/refreshes"] >= 1 for r in records)
    # The newest snapshot the surviving GU converted is what its actors load (a full copy): it
    # equals the trainer's final weights in the snapshot's dtype, bit for bit.
    converted = latest_published(run_dir / "snapshots" / f"gu{gus - 1}")
    assert converted is not None and converted.version == 4, converted
    got = load_file(str(converted.path / "rank-00000.safetensors"))
    final = load_file(str(run_dir / "final_model" / "model.safetensors"))
    assert set(got) <= set(final) and len(got) > 0
    for tensor_name, tensor in got.items():
        want = final[tensor_name].to(tensor.dtype)
        assert torch.equal(tensor.view(torch.uint8), want.contiguous().view(torch.uint8)), tensor_name
