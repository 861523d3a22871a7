"""``builtin:arith_tools``: multiply two numbers, a task where the code tool matters.

A prompt is ``"<a>*<b>="`` with ``a`` and ``b`` of 2-3 digits; the answer is the product, then
eos, written with six digits. Example: ``"37*482="`` -> ``"017834"``. The tiny CPU model cannot
multiply in its head, but it can with the code tool: copy the prompt into a call
(``'%06d'%(37*482)``), then copy the tool's output. Both copies sit at a fixed offset from their
source in the trajectory (the call's wrapping and the tool response's chat-template wrapping have
constant lengths, and the six-digit output makes the answer's distance from it constant too),
which a 2-layer model with rotary positions learns; without the padding the distance varies with
the product's length and the tiny model does not learn the second copy in a short warm-up
(measured).

The SFT warm-up (``arith_tools_sft_pairs``) is deliberately imperfect: a tenth of its targets
answer directly (a product the model cannot learn, so it guesses), the rest call the tool, in a
warm-up too short to learn the call perfectly. The token-mean SFT loss weighs a direct answer's
first token ~20x more than a ~140-token trajectory's, so a 90/10 mix leaves a policy that calls the
tool in roughly a quarter of its samples, about 60% of the calls well-formed (measured, 600
steps). RL is rewarded only when the answer is right: GRPO then
raises the calling share, the share of well-formed calls and the reward (``arith_tools_reward``,
exact match of the model's own final answer, 1 or 0).
"""

from __future__ import annotations

import json
import re

import numpy as np

from mindspeed_rl.datasets.demo_task import clean_response

TOOL_NAME = "python"
"""The function name of ``configs/tools/tiny_python.yaml`` (short: the tiny model writes it char by char)."""
CLOSE_MARKER = "</tool_call>"
ANSWER_DIGITS = 6
"""999 * 999 = 998001: every product fits six digits."""
_PROMPT = re.compile(r"^(\d+)\*(\d+)=$")
_RL_STREAM, _SFT_STREAM = 0, 1
# Observation wrapping of the agent loop's default ObservationFormat (Qwen2.5's tool turn); the
# warm-up trajectories must be what the loop appends, token for token.
_TURN_PREFIX = "\n<|im_start|>user"
_RESPONSE_PREFIX = "\n<tool_response>\n"
_RESPONSE_SUFFIX = "\n</tool_response>"
_TURN_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


def answer_for(prompt: str) -> str:
    match = _PROMPT.match(prompt)
    if match is None:
        raise ValueError(f"not an arith_tools prompt: {prompt!r}; expected '<a>*<b>=' like '37*482='")
    return f"{int(match.group(1)) * int(match.group(2)):0{ANSWER_DIGITS}d}"


def tool_call_text(prompt: str) -> str:
    """The hermes call a trajectory makes for ``prompt`` (compact JSON)."""
    payload = {"name": TOOL_NAME, "arguments": {"code": f"'%0{ANSWER_DIGITS}d'%({prompt.rstrip('=')})"}}
    return f"<tool_call>{json.dumps(payload, separators=(',', ':'))}{CLOSE_MARKER}"


def tool_trajectory(prompt: str) -> str:
    """The full response of a trajectory that uses the tool right: call, tool turn, answer.

    The tool turn holds what ReTool answers (the printed product and its newline)."""
    answer = answer_for(prompt)
    observation = _TURN_PREFIX + _RESPONSE_PREFIX + answer + "\n" + _RESPONSE_SUFFIX + _TURN_SUFFIX
    return tool_call_text(prompt) + observation + answer


def _draw_prompt(rng: np.random.Generator) -> str:
    digits = rng.integers(2, 4, size=2)
    a, b = (int(rng.integers(10 ** (d - 1), 10**d)) for d in digits)
    return f"{a}*{b}="


def generate_arith_tools_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` RL prompts as ``{"prompt": "37*482=", "answer": "17834"}``; deterministic in ``seed``."""
    if num < 0:
        raise ValueError(f"num must be >= 0; got {num}")
    rng = np.random.default_rng([seed, _RL_STREAM])
    prompts = [_draw_prompt(rng) for _ in range(num)]
    return [{"prompt": p, "answer": answer_for(p)} for p in prompts]


def arith_tools_sft_pairs(num: int, seed: int, *, tool_fraction: float = 0.9) -> list[tuple[str, str]]:
    """``num`` warm-up (prompt, target) pairs from a stream disjoint from the RL prompts': a
    ``tool_fraction`` share are tool trajectories, the rest answer directly."""
    if num < 0 or not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(
            f"need num >= 0 and 0 <= tool_fraction <= 1; got num={num}, tool_fraction={tool_fraction}"
        )
    rng = np.random.default_rng([seed, _SFT_STREAM])
    pairs: list[tuple[str, str]] = []
    for _ in range(num):
        prompt = _draw_prompt(rng)
        use_tool = bool(rng.random() < tool_fraction)
        pairs.append((prompt, tool_trajectory(prompt) if use_tool else answer_for(prompt)))
    return pairs


def final_answer(model_text: str) -> str:
    """What the model answered: its text after its last tool call (all of it without one)."""
    return clean_response(model_text.rsplit(CLOSE_MARKER, 1)[-1]).strip()


def arith_tools_reward(response: str, label: str, tool_rounds: int = 0) -> float:
    """1 when the model's own final answer is the product (leading zeros optional), else 0.

    ``response`` is the model's text with tool responses removed (``ToolRecord.model_text``), so
    the tool's printed product earns nothing unless the model writes it; ``tool_rounds`` is not
    scored (the reward is for the answer, however it was reached)."""
    del tool_rounds
    answer = final_answer(response)
    return 1.0 if answer.isdigit() and int(answer) == int(label) else 0.0


def trajectory_tokens(prompt: str) -> int:
    """Response tokens of the right tool trajectory for ``prompt`` under the character tokenizer
    (each ``<|...|>`` special is one token), eos included: what an oracle length predictor knows."""
    text = tool_trajectory(prompt)
    specials = re.findall(r"<\|[a-z_]+\|>", text)
    return len(text) - sum(len(s) - 1 for s in specials) + 1
