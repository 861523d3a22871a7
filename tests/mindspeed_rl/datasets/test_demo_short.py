"""``builtin:demo_short``: the demo task with a light length tail, for ``make demo`` only.

``builtin:demo`` must not move (the ASP benchmarks and schedule hashes are measured on it), so the
short variant is checked to be an addition: same format, same seed stream, shorter counts.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from mindspeed_rl.datasets.demo_task import (
    DEFAULT_LENGTHS,
    SHORT_LENGTHS,
    DemoLengths,
    answer_for,
    generate_demo_prompts,
    generate_demo_short_prompts,
)
from mindspeed_rl.datasets.loader import load_prompts
from mindspeed_rl.trainer import run_schedule
from tests.support.plans import prompt_records, small_async_plan

# sha256 of json.dumps(generate_demo_prompts(500, 7)) measured before builtin:demo_short existed.
_DEMO_500_SEED7 = "6fa258ea352a5db9904b873a8ae0478d771b9af645a94db3a4faff26958e1805"


def test_builtin_demo_is_unchanged() -> None:
    assert DemoLengths(median_count=8.0, sigma=0.8, max_count=150) == DEFAULT_LENGTHS
    digest = hashlib.sha256(json.dumps(generate_demo_prompts(500, 7)).encode()).hexdigest()
    assert digest == _DEMO_500_SEED7


def test_short_prompts_are_demo_prompts_with_short_counts() -> None:
    items = generate_demo_short_prompts(3000, 0)
    assert items == generate_demo_short_prompts(3000, 0) != generate_demo_short_prompts(3000, 1)
    for item in items[:300]:
        assert item["answer"] == answer_for(item["prompt"])
    lengths = np.array([len(d["answer"]) for d in items])
    assert lengths.min() >= 1 and lengths.max() <= SHORT_LENGTHS.max_count
    # Still prompt-dependent (something for the length-aware schedule to order), but no long tail.
    assert 4 <= np.median(lengths) <= 6 and np.percentile(lengths, 95) >= 2 * np.median(lengths)
    default = np.array([len(d["answer"]) for d in generate_demo_prompts(3000, 0)])
    assert lengths.mean() < 0.7 * default.mean()


def test_builtin_demo_short_source(char_tokenizer) -> None:
    prompts = load_prompts(
        data_path="builtin:demo_short", tokenizer=char_tokenizer, max_prompt_length=4096, num_samples=6
    )
    assert [r.prompt_id for r in prompts.records] == [f"demo_short-s0-{i}" for i in range(6)]
    assert [r.label for r in prompts.records] == [d["answer"] for d in generate_demo_short_prompts(6, 0)]


@pytest.mark.parametrize("data_path", ["builtin:demo", "builtin:demo_short"])
def test_demo_variants_warm_up_and_feed_the_oracle(data_path: str) -> None:
    plan = small_async_plan(f"megatron_training.data_path={data_path}")
    assert plan.warmup is not None
    lengths = run_schedule.true_lengths(plan.data, prompt_records(3))
    assert lengths == {"p0": 1.0, "p1": 2.0, "p2": 3.0}
