"""Upstream's ``retool_reward`` (its multi-turn DAPO recipe's scorer): strict-box +1 / -1, a wrong
answer earns 0.1 per tool round up to 0, and only the policy's own tokens can hold the answer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mindspeed_rl.models.rewards import RewardConfig, RewardFunction, build_reward_fn, known_verifiers
from mindspeed_rl.models.rewards.registry import check_verifier_names
from mindspeed_rl.models.rewards.retool import ToolRecord, retool_reward, tool_record
from mindspeed_rl.runtime.records import Sample
from mindspeed_rl.workers.reward_inputs import reward_inputs
from tests.mindspeed_rl.tools.test_agent_loop import CharCodec, FnTool, ScriptedModel, call, make_loop, prompt


@pytest.mark.parametrize(
    ("response", "label", "rounds", "score"),
    [
        ("so the product is \\boxed{42}", "42", 0, 1.0),
        ("so the product is \\boxed{42}", "42", 3, 1.0),  # no bonus on top of a right answer
        ("so the product is \\boxed{41}", "42", 0, -1.0),
        ("so the product is \\boxed{41}", "42", 1, -0.9),
        ("so the product is \\boxed{41}", "42", 3, -0.7),
        ("so the product is \\boxed{41}", "42", 10, 0.0),  # capped at 0: never a right answer's worth
        ("so the product is \\boxed{41}", "42", 25, 0.0),
        ("the product is 42", "42", 0, -1.0),  # no box at all
        ("the product is 42", "42", 2, -0.8),
        ("the product is \\boxed{42", "42", 0, -1.0),  # unclosed box (cut at max tokens)
        ("\\boxed{42}" + " and some more words" * 6, "42", 0, -1.0),  # box outside the last 100 chars
        ("the product is \\boxed{42.0}", "42", 0, -1.0),  # strict: character for character
        ("first \\boxed{42} then \\boxed{7}", "42", 0, -1.0),  # the last box is the answer
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 0, 1.0),  # nested braces
        ("", "42", 0, -1.0),
    ],
)
def test_scores(response: str, label: str, rounds: int, score: float) -> None:
    assert retool_reward(response, label, rounds) == pytest.approx(score)


def test_negative_rounds_are_an_error() -> None:
    with pytest.raises(ValueError, match="tool_rounds=-1"):
        retool_reward("\\boxed{1}", "1", -1)


def test_registered_and_accepted_by_the_plan_check() -> None:
    assert "retool_reward" in known_verifiers()
    check_verifier_names(["retool_reward"])  # no longer refused


def _decode(ids: list[int]) -> str:
    return CharCodec().decode(ids)


def test_tool_record_counts_masked_blocks_and_drops_their_text() -> None:
    text = "ab<r>xx</r>cd<r>y</r>"
    mask = [1, 1] + [0] * 9 + [1, 1] + [0] * 8
    record = tool_record(CharCodec().encode(text), mask, _decode)
    assert record == ToolRecord(model_text="abcd", tool_rounds=2)
    assert tool_record([1, 2], [], _decode) is None  # single-turn: no record
    with pytest.raises(ValueError, match="3 values for 2 response tokens"):
        tool_record([1, 2], [1, 1, 0], _decode)


def _reward(names: Sequence[str] = ("retool_reward",)) -> RewardFunction:
    return build_reward_fn(RewardConfig(verifier_function=list(names), verifier_weight=[1.0] * len(names)))


class _CharTokenizer:
    """The agent loop tests' one-token-per-character codec with a tokenizer's decode signature."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return CharCodec().decode(token_ids)


def _sample(completion_ids: tuple[int, ...], mask: tuple[int, ...]) -> Sample:
    return Sample(
        prompt_id="p", sample_index=0, minibatch_id=0, response_token_ids=completion_ids,
        rollout_log_probs=(0.0,) * len(completion_ids), reward=None, policy_version=0, gu_id=0,
        actor_id=0, sent_at=0.0, loss_mask=mask,
    )  # fmt: skip


def test_an_answer_inside_a_tool_response_does_not_count() -> None:
    # A trajectory from the real agent loop: the model calls the tool, the tool prints a boxed
    # answer, and the total budget ends the response right after the tool response. Upstream's
    # scorer (the whole text) would grade the tool's box as the answer; the model never wrote it.
    model = ScriptedModel(lambda p, k, ctx: call("py", code="print(6*7)") if k == 0 else "\\boxed{42}")
    first = len(call("py", code="print(6*7)"))
    budget = first + len("<r>\\boxed{42}</r>")
    loop = make_loop(model, [FnTool("py", lambda a: "\\boxed{42}")], max_total_response_length=budget)
    (cut,) = loop.run([prompt("A")])
    loop = make_loop(model, [FnTool("py", lambda a: "\\boxed{42}")])
    (answered,) = loop.run([prompt("B")])  # the same call, then the model writes the box itself
    samples = [_sample(c.token_ids, c.loss_mask or ()) for c in (cut.completion, answered.completion)]
    texts, records = reward_inputs(samples, _CharTokenizer())
    assert texts[0].endswith("<r>\\boxed{42}</r>") and records is not None
    assert records[0] == ToolRecord(model_text=call("py", code="print(6*7)"), tool_rounds=1)
    with _reward() as fn:
        scored = fn(texts, ["42", "42"], records)
    # The cut trajectory: wrong (no model-written box), +0.1 for its one tool round.
    assert scored.rewards.tolist() == pytest.approx([-0.9, 1.0])
    # Without the records (how upstream scores: the whole text) the tool's box would earn +1.
    with _reward() as fn:
        assert fn(texts, ["42", "42"]).rewards.tolist() == pytest.approx([1.0, 1.0])


def test_reward_function_mixes_tool_aware_and_plain_verifiers() -> None:
    texts = ["x<r>\\boxed{5}</r>", "\\boxed{5}"]
    records = [ToolRecord(model_text="x", tool_rounds=1), None]  # the second is single-turn
    with _reward(("retool_reward", "acc_for_dapo_strict_box")) as fn:
        scored = fn(texts, ["5", "5"], records)
        # retool reads the record when there is one, the whole text otherwise; the plain
        # verifier always reads the whole text, so it takes the tool's box for an answer.
        assert scored.per_verifier["retool_reward"].tolist() == pytest.approx([-0.9, 1.0])
        assert scored.per_verifier["acc_for_dapo_strict_box"].tolist() == pytest.approx([1.0, 1.0])
        assert scored.rewards.tolist() == pytest.approx([0.1, 2.0])
        with pytest.raises(ValueError, match="1 tool records for 2 responses"):
            fn(texts, ["5", "5"], records[:1])


def test_single_turn_samples_give_no_records() -> None:
    texts, records = reward_inputs([_sample((65, 66), ())], _CharTokenizer())
    assert texts == ["AB"] and records is None
