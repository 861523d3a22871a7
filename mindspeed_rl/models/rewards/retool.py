"""Upstream's ``retool_reward``: the ReTool scorer of its multi-turn DAPO recipe.

Semantics (Ascend/MindSpeed-RL master 05a90d7, ``models/rule_verifier.py`` over
``models/math_dapo.py``; read for its behaviour, not copied):

* the answer is DAPO's strict box: the last complete ``\\boxed{...}`` among the last 100
  characters, equal to the label character for character: +1, otherwise -1 (``acc_for_dapo_strict_box``);
* a wrong (or missing) answer earns 0.1 per tool round the trajectory made, capped at 0: trying
  the tool is better than not, but never as good as a right answer.

One deliberate difference: upstream scores the decoded response *with* the tool responses in it,
so a tool output that ends in ``\\boxed{...}`` (a trajectory cut right after a tool response) can be
graded as the model's answer. Here the answer is read from the model's own tokens only
(``ToolRecord.model_text``: the response with its tool-response spans removed), so only what the
policy wrote can earn the reward.

String work, linear in the response: it runs in the calling process (bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mindspeed_rl.models.rewards.dapo_math import acc_for_dapo_strict_box

TOOL_ROUND_BONUS = 0.1
"""Upstream's per-round credit for a wrong answer (never lifting it above 0)."""


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """What a tool-aware verifier reads of one multi-turn sample besides its full text."""

    model_text: str
    """The response decoded from the policy's own tokens (loss mask 1): tool responses removed."""
    tool_rounds: int
    """Tool responses appended to the trajectory (upstream's ``tool_call_num``): one per round,
    however many parallel calls that round ran."""


def tool_record(
    token_ids: Sequence[int], loss_mask: Sequence[int], decode: Callable[[list[int]], str]
) -> ToolRecord | None:
    """The ``ToolRecord`` of a response with a loss mask; None for a single-turn one (empty mask).

    A tool round is one maximal run of masked (0) tokens: the agent loop appends each round's
    responses, with their chat-template wrapping, as one masked block between model turns."""
    if not loss_mask:
        return None
    if len(loss_mask) != len(token_ids):
        raise ValueError(
            f"loss_mask has {len(loss_mask)} values for {len(token_ids)} response tokens; "
            "the generation actor must record one 0/1 per token"
        )
    model_ids = [t for t, keep in zip(token_ids, loss_mask) if keep]
    rounds = sum(1 for i, keep in enumerate(loss_mask) if not keep and (i == 0 or loss_mask[i - 1]))
    return ToolRecord(model_text=decode(model_ids), tool_rounds=rounds)


def retool_reward(response: str, label: str, tool_rounds: int = 0) -> float:
    """+1 for the right strict-box answer; otherwise -1 + 0.1 per tool round, at most 0."""
    if tool_rounds < 0:
        raise ValueError(f"tool_rounds={tool_rounds}; a trajectory makes 0 or more tool rounds")
    score = acc_for_dapo_strict_box(response, label)
    if score < 0:
        score = min(0.0, score + TOOL_ROUND_BONUS * tool_rounds)
    return score
