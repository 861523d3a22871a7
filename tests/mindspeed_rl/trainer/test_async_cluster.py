"""The async cluster's start-up specs: one GU spec per unit, each run under its own snapshot folder."""

from __future__ import annotations

from pathlib import Path

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer import async_cluster
from mindspeed_rl.workers.fault_plan import FaultPlan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_gu_specs_one_per_unit_with_its_own_cache() -> None:
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_asp",
        ("async_config.num_generation_units=3", "async_config.actor_resources.num_cpus=0.3"),
    )
    plan = build_run_plan(config)
    specs = async_cluster.gu_specs(plan, "/m", {}, Path("/snap"), FaultPlan(gu_dies={2: 1}))
    assert [s.gu_id for s in specs] == [0, 1, 2]
    assert len({s.cache_dir for s in specs}) == 3 and all(s.cache_dir.startswith("/snap/") for s in specs)
    assert all(s.actor_options["num_cpus"] == 0.3 == s.actor_num_cpus for s in specs)
    assert all(s.faults.gu_dies == {2: 1} for s in specs)
    assert all(s.rollout == plan.rollout and s.seed == config.megatron_training.training.seed for s in specs)
