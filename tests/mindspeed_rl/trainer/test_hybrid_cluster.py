"""The hybrid cluster's Ray-free parts: one rollout engine per run, samples grouped by prompt."""

from __future__ import annotations

from pathlib import Path

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.runtime.records import CompletedMinibatch, Sample
from mindspeed_rl.trainer.hybrid_cluster import HybridCluster, group_by_prompt
from mindspeed_rl.utils.placement import ClusterSpec

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _placement(tp: int):
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_cpu",
        ("rl_config.actor_resource.num_gpus=2", f"generate_config.infer_tensor_parallel_size={tp}"),
    )
    return build_run_plan(config).check_fits(ClusterSpec.parse("1x2"))


def test_a_colocated_placement_with_several_rollout_engines_is_accepted() -> None:
    # One TP2 engine over the trainer's two GPUs, or two TP1 engines: each in its ranks' processes
    # (workers/colocated_rank.py); test_colocated_rank.py has the uncolocated refusal.
    HybridCluster.check_placement(_placement(tp=2))
    HybridCluster.check_placement(_placement(tp=1))


def _sample(pid: str, i: int) -> Sample:
    return Sample(prompt_id=pid, sample_index=i, minibatch_id=3, response_token_ids=(1,), rollout_log_probs=(0.0,),
                  reward=None, policy_version=0, gu_id=0, actor_id=0, sent_at=0.0)  # fmt: skip


def test_samples_are_grouped_by_prompt_in_the_minibatch_order() -> None:
    samples = (_sample("b", 0), _sample("a", 0), _sample("b", 1), _sample("a", 1))
    completed = CompletedMinibatch(minibatch_id=3, attempt=0, samples=samples, gu_id=0, actor_id=0,
                                   policy_version=0, started_at=0.0, finished_at=1.0)  # fmt: skip
    groups = group_by_prompt(completed)
    assert [(g.prompt_id, g.minibatch_id, len(g.samples)) for g in groups] == [("b", 3, 2), ("a", 3, 2)]
    assert [s.sample_index for s in groups[0].samples] == [0, 1]
