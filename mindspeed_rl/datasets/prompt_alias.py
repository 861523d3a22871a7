"""The id a prompt gets when a run draws it again (a later pass over a small dataset).

The runtime tracks prompts by id and consumes each scheduled one exactly once, so the second
draw of ``q17`` is scheduled as ``q17@1``, the third as ``q17@2``. Whatever learns about a
prompt across its draws (online ASP's per-prompt history) keys it by :func:`prompt_of`, which
undoes the alias.
"""

from __future__ import annotations

ALIAS_SEP = "@"


def pass_alias(prompt_id: str, draw: int) -> str:
    """``prompt_id`` for its first draw (``draw`` 0), ``<prompt_id>@<draw>`` after."""
    if draw < 0:
        raise ValueError(f"draw {draw} < 0; draws count from 0 (the first pass keeps the prompt's id)")
    return prompt_id if draw == 0 else f"{prompt_id}{ALIAS_SEP}{draw}"


def prompt_of(scheduled_id: str) -> str:
    """The prompt behind a scheduled id: ``q17@2`` -> ``q17``; an id without a numeric alias is
    its own prompt. A dataset id that itself ends in ``@<digits>`` is read as an alias of the
    part before it; that only makes the two share online estimates, never their consumption."""
    head, sep, tail = scheduled_id.rpartition(ALIAS_SEP)
    return head if sep and head and tail.isdigit() and tail[0] != "0" else scheduled_id
