"""Chat templates selected by upstream's ``prompt_type`` (our own wording and layout).

- ``empty``: the raw prompt (system text, if any, on the line before it).
- ``qwen_r1``: Qwen ChatML turns; the user turn asks for reasoning inside ``<think></think>`` and
  the final answer in ``\\boxed{}`` — the layout the ``format``/``acc`` verifiers check.
- ``qwen3``: plain Qwen3 ChatML turns (Qwen3 models produce their own ``<think>`` block).

Every template ends where the assistant starts writing, so rollout continues from the text.
"""

from __future__ import annotations

import difflib

R1_SYSTEM = "You are a careful problem solver. Think the problem through step by step before answering."
R1_INSTRUCTION = (
    "Write your reasoning between <think> and </think>, then give the final answer "
    "in \\boxed{} after the closing tag."
)


def _chatml(system: str, user: str) -> str:
    system_turn = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{system_turn}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _empty(prompt: str, system: str) -> str:
    return f"{system}\n{prompt}" if system else prompt


def _qwen_r1(prompt: str, system: str) -> str:
    return _chatml(system or R1_SYSTEM, f"{prompt}\n{R1_INSTRUCTION}")


def _qwen3(prompt: str, system: str) -> str:
    return _chatml(system, prompt)


_TEMPLATES = {"empty": _empty, "qwen_r1": _qwen_r1, "qwen3": _qwen3}


def known_prompt_types() -> tuple[str, ...]:
    return tuple(sorted(_TEMPLATES))


def check_prompt_type(prompt_type: str) -> None:
    if prompt_type not in _TEMPLATES:
        nearest = difflib.get_close_matches(prompt_type, list(_TEMPLATES), n=1, cutoff=0.0)
        raise ValueError(
            f"unknown prompt_type {prompt_type!r}; did you mean {nearest[0]!r}? "
            f"Known prompt types: {', '.join(known_prompt_types())}"
        )


def apply_template(prompt_type: str, prompt: str, *, system: str = "") -> str:
    """The text handed to the tokenizer for one prompt."""
    check_prompt_type(prompt_type)
    return _TEMPLATES[prompt_type](prompt, system)
