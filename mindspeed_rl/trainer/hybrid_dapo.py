"""DAPO's dynamic sampling in the hybrid loop, as upstream runs it: generate a batch of
``generation_batch_prompts`` (global_batch_size), drop the groups whose filter metric has no
spread, generate the next batch until ``train_batch_prompts`` (filter_groups_train_batch_size)
groups are kept (at most ``max_batches`` generation batches per iteration), train an iteration on
exactly that many.

One generation can feed several iterations: with a train batch smaller than the generation batch,
every whole train batch of its kept groups is one iteration, back to back, before anything is
generated again (those iterations' old log-probs are the rollout's: ``plan.correction``). Kept
groups that no longer make a whole train batch are dropped (consumed, counted as
``dapo/groups_surplus``) rather than mixed with the next generation's: the hybrid loop never trains
samples of two weight versions in one step. Every drawn prompt is consumed once, kept, filtered or
surplus, by the iteration that generated it, so a resumed run skips exactly the generation batches
its lineage recorded (kept groups still waiting for their iteration at a checkpoint are then
surplus too).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mindspeed_rl.runtime.group_filter import GroupFilter

if TYPE_CHECKING:
    from mindspeed_rl.contracts import DynamicSampling
    from mindspeed_rl.runtime.records import PromptGroup
    from mindspeed_rl.trainer.hybrid_cluster import HybridCluster


@dataclass(frozen=True, slots=True, kw_only=True)
class DapoIteration:
    record: dict[str, float]
    consumed_prompt_ids: tuple[str, ...]


class HybridDynamicSampling:
    """The loop's filter state across iterations (totals for summary.json)."""

    def __init__(self, sampling: DynamicSampling) -> None:
        self.sampling = sampling
        self.filter = GroupFilter(
            generation_batch_prompts=sampling.generation_batch_prompts,
            max_prompts_per_step=sampling.max_prompts_per_step(),
        )
        self.groups_surplus_total = 0
        self.prompts_oversampled_total = 0
        self._ready: list[PromptGroup] = []
        """Kept groups of the latest generation, at least one whole train batch, in draw order."""

    def iteration(
        self, cluster: HybridCluster, iteration: int, batches: Iterator[tuple[str, ...]]
    ) -> DapoIteration:
        need = self.sampling.train_batch_prompts
        consumed: list[str] = []
        filtered = gen_batches = 0
        gen_s = 0.0
        if not self._ready:
            kept: list[PromptGroup] = []
            while len(kept) < need:
                self._check_limit(iteration, gen_batches, len(kept), filtered)
                prompt_ids = next(batches, None)
                if prompt_ids is None:
                    raise RuntimeError(
                        f"dynamic sampling ran out of prompts at iteration {iteration} ({len(kept)} of {need} "
                        "groups kept); raise rl_config.filter_groups_max_batches (the run draws max_batches x "
                        "its prompts) or add data"
                    )
                start = time.perf_counter()
                groups = cluster.generate(iteration, prompt_ids)
                gen_s += time.perf_counter() - start
                if gen_batches:  # beyond the one batch a run without dynamic sampling generates
                    self.prompts_oversampled_total += len(prompt_ids)
                gen_batches += 1
                consumed.extend(prompt_ids)
                keep, drop = self.filter.split(groups)
                kept.extend(keep)
                filtered += len(drop)
            self._ready = kept
        step, self._ready = tuple(self._ready[:need]), self._ready[need:]
        surplus = 0
        if len(self._ready) < need:  # no whole train batch left of this generation
            surplus, self._ready = len(self._ready), []
            self.groups_surplus_total += surplus
        record = cluster.train_and_push(iteration, step, gen_s=gen_s)
        record.update(
            {
                "dapo/groups_kept": float(need),
                "dapo/groups_filtered": float(filtered),
                "dapo/groups_surplus": float(surplus),
                "dapo/gen_batches": float(gen_batches),
            }
        )
        return DapoIteration(record=record, consumed_prompt_ids=tuple(consumed))

    def _check_limit(self, iteration: int, gen_batches: int, kept: int, filtered: int) -> None:
        limit = self.sampling.max_batches
        if limit is not None and gen_batches >= limit:
            raise RuntimeError(
                f"dynamic sampling: iteration {iteration} kept {kept} of the "
                f"{self.sampling.train_batch_prompts} groups it needs after "
                f"rl_config.filter_groups_max_batches={limit} generation batches ({filtered} groups "
                "filtered); raise filter_groups_max_batches (or -1 for no limit), or filter on a metric "
                "fewer groups agree on"
            )

    def summary(self) -> dict[str, int]:
        """Whole-run totals; kept groups the run ended before training are surplus."""
        return {
            "groups_filtered_total": self.filter.filtered_total,
            "groups_kept_total": self.filter.kept_total,
            "groups_surplus_total": self.groups_surplus_total + len(self._ready),
            "prompts_oversampled_total": self.prompts_oversampled_total,
        }
