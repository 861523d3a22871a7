"""What the reward function reads of a batch of samples: each response's decoded text and, for
multi-turn samples (a loss mask), its ToolRecord (the model's own text and its tool rounds).

Shared by the Training Unit (the reward it trains on) and the generation actor's dynamic-sampling
filter score, so both pipelines and both places score a trajectory the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from mindspeed_rl.models.rewards.retool import ToolRecord, tool_record

if TYPE_CHECKING:
    from mindspeed_rl.runtime.records import Sample


class _Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def reward_inputs(
    samples: Sequence[Sample], tokenizer: _Decoder
) -> tuple[list[str], list[ToolRecord | None] | None]:
    """(texts, tool records or None when no sample used tools)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    texts = [decode(list(s.response_token_ids)) for s in samples]
    records = [tool_record(s.response_token_ids, s.loss_mask, decode) for s in samples]
    return texts, records if any(r is not None for r in records) else None
