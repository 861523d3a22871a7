"""Dynamic sampling's per-sample score, computed where the sample is born (the generation actor),
so the Control Unit can drop a group without spread before it enters the Training Queue and
before it costs the trainer anything. The Training Unit still computes the full reward (every
verifier, the overlong penalty) on the groups it trains on; this is the one filter metric only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.models.rewards import RewardConfig
    from mindspeed_rl.runtime.records import Sample


class FilterScorer:
    def __init__(self, scorer: RewardConfig, policy_path: str) -> None:
        from mindspeed_rl.models.rewards import build_reward_fn
        from mindspeed_rl.models.tokenizer import load_tokenizer

        self._reward_fn = build_reward_fn(scorer)
        self._tokenizer = load_tokenizer(policy_path)

    def score(self, samples: Sequence[Sample], prompts: Mapping[str, PromptRecord]) -> None:
        """Set ``filter_score`` on every sample (in place: samples are the actor's own until sent)."""
        from mindspeed_rl.workers.reward_inputs import reward_inputs

        responses, tool_records = reward_inputs(samples, self._tokenizer)
        labels = [prompts[s.prompt_id].label for s in samples]
        scores = self._reward_fn(responses, labels, tool_records).rewards
        for sample, value in zip(samples, scores):
            sample.filter_score = float(value)

    def close(self) -> None:
        self._reward_fn.close()
