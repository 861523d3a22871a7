"""The hybrid loop's DAPO batching, upstream's semantics: generation batches of global_batch_size,
groups without spread dropped, one iteration trained on every filter_groups_train_batch_size kept
groups (several iterations per generation batch when it is the smaller), the remainder that makes
no whole train batch dropped as surplus, every drawn prompt consumed once.

The cluster is a stand-in (no Ray, no engines): the test is about which groups each iteration
trains and which prompts it consumes, which ``HybridDynamicSampling`` decides alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from mindspeed_rl.contracts import DynamicSampling
from mindspeed_rl.models.rewards.config import RewardConfig
from mindspeed_rl.runtime.records import PromptGroup, Sample
from mindspeed_rl.trainer.hybrid_dapo import HybridDynamicSampling


class FakeCluster:
    """``generate`` scores every sample of a prompt in ``uniform`` alike (the group has no spread)."""

    def __init__(self, uniform: set[str]) -> None:
        self.uniform = uniform
        self.generated: list[tuple[str, ...]] = []
        self.trained: list[tuple[str, ...]] = []

    def generate(self, iteration: int, prompt_ids: tuple[str, ...]) -> tuple[PromptGroup, ...]:
        self.generated.append(prompt_ids)
        return tuple(
            PromptGroup(
                prompt_id=pid,
                minibatch_id=iteration,
                samples=tuple(self._sample(pid, i, iteration) for i in range(2)),
            )
            for pid in prompt_ids
        )

    def _sample(self, pid: str, index: int, iteration: int) -> Sample:
        return Sample(
            prompt_id=pid, sample_index=index, minibatch_id=iteration, response_token_ids=(1,),
            rollout_log_probs=(-0.5,), reward=0.0, policy_version=iteration, gu_id=0, actor_id=0,
            sent_at=0.0, filter_score=0.0 if pid in self.uniform else float(index),
        )  # fmt: skip

    def train_and_push(
        self, iteration: int, groups: tuple[PromptGroup, ...], *, gen_s: float
    ) -> dict[str, float]:
        self.trained.append(tuple(g.prompt_id for g in groups))
        return {"iteration": float(iteration)}


def _sampling(train: int, gen: int, max_batches: int | None = None) -> DynamicSampling:
    scorer = RewardConfig(
        verifier_function=("acc",), verifier_weight=(1.0,), verifier_parallel=1, verifier_timeout=1.0
    )
    return DynamicSampling(
        metric="acc",
        max_batches=max_batches,
        train_batch_prompts=train,
        generation_batch_prompts=gen,
        scorer=scorer,
    )


def _batches(size: int, count: int) -> Iterator[tuple[str, ...]]:
    return iter([tuple(f"p{b * size + i}" for i in range(size)) for b in range(count)])


def _run(sampling: DynamicSampling, uniform: set[str], iterations: int, batches: int = 20):
    cluster, dapo = FakeCluster(uniform), HybridDynamicSampling(sampling)
    todo = _batches(sampling.generation_batch_prompts, batches)
    done = [dapo.iteration(cluster, i, todo) for i in range(iterations)]  # type: ignore[arg-type]
    return cluster, dapo, done


def test_train_batch_of_2_from_generation_batches_of_8() -> None:
    # Batch 0 keeps p0..p4 (5 groups: two iterations, p4 surplus), batch 1 keeps all 8 (four).
    uniform = {"p5", "p6", "p7"}
    cluster, dapo, done = _run(_sampling(train=2, gen=8), uniform, iterations=6)
    assert cluster.trained == [
        ("p0", "p1"),
        ("p2", "p3"),
        ("p8", "p9"),
        ("p10", "p11"),
        ("p12", "p13"),
        ("p14", "p15"),
    ]
    assert [len(d.consumed_prompt_ids) for d in done] == [
        8,
        0,
        8,
        0,
        0,
        0,
    ]  # consumed by the generating iteration
    consumed = Counter(p for d in done for p in d.consumed_prompt_ids)
    assert max(consumed.values()) == 1 and set(consumed) == {f"p{i}" for i in range(16)}
    assert [d.record["dapo/groups_surplus"] for d in done] == [0, 1, 0, 0, 0, 0]
    assert [d.record["dapo/gen_batches"] for d in done] == [1, 0, 1, 0, 0, 0]
    assert [d.record["dapo/groups_filtered"] for d in done] == [3, 0, 0, 0, 0, 0]
    assert all(d.record["dapo/groups_kept"] == 2 for d in done)
    assert dapo.summary() == {
        "groups_filtered_total": 3, "groups_kept_total": 13, "groups_surplus_total": 1, "prompts_oversampled_total": 0,
    }  # fmt: skip


def test_a_generation_batch_short_of_a_train_batch_is_topped_up_with_the_next() -> None:
    # Batch 0 keeps only p0: the same iteration generates batch 1 and trains p0 with p4 (same weights).
    uniform = {"p1", "p2", "p3", "p5", "p6"}
    cluster, dapo, done = _run(_sampling(train=2, gen=4), uniform, iterations=2)
    assert cluster.trained == [("p0", "p4"), ("p8", "p9")]
    assert [d.record["dapo/gen_batches"] for d in done] == [2, 1]
    # p7 was kept but makes no whole train batch: surplus of iteration 0; p10, p11 await iteration 2.
    assert [d.record["dapo/groups_surplus"] for d in done] == [1, 0]
    assert dapo.summary()["groups_surplus_total"] == 3  # the run ended before training p10, p11
    assert dapo.summary()["prompts_oversampled_total"] == 4


def test_equal_train_and_generation_batches_keep_todays_one_iteration_per_fill() -> None:
    uniform = {"p1", "p2"}
    cluster, _, done = _run(_sampling(train=4, gen=4), uniform, iterations=2)
    assert cluster.trained == [("p0", "p3", "p4", "p5"), ("p8", "p9", "p10", "p11")]
    assert [d.record["dapo/groups_surplus"] for d in done] == [2, 0]  # p6, p7: never a stale step


def test_the_max_batches_rule_counts_one_iterations_generation_batches() -> None:
    uniform = {f"p{i}" for i in range(12)}
    with pytest.raises(RuntimeError, match="filter_groups_max_batches=2 generation batches"):
        _run(_sampling(train=2, gen=4, max_batches=2), uniform, iterations=1)
