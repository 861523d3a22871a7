"""Typed records that leave the data layer: prompts, the drop report, the loaded prompt set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# How many dropped prompt ids each reason keeps for the report (enough to go and look).
NUM_EXAMPLE_IDS = 5


class Tokenizer(Protocol):
    """What the data layer needs from a tokenizer (any HF tokenizer satisfies it)."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt ready for rollout: templated text, its token ids and the reward label."""

    prompt_id: str
    text: str
    token_ids: tuple[int, ...]
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DropReport:
    """Prompts left out while loading, counted by reason, with the first few ids per reason."""

    num_total: int
    counts: Mapping[str, int]
    examples: Mapping[str, tuple[str, ...]]
    num_unsampled: int = 0
    """Prompts that passed every filter but were not drawn into the ``num_samples`` subset."""

    @property
    def num_dropped(self) -> int:
        return sum(self.counts.values())

    @property
    def num_kept(self) -> int:
        return self.num_total - self.num_dropped - self.num_unsampled

    def summary(self) -> str:
        text = f"kept {self.num_kept} of {self.num_total} prompts"
        if self.num_unsampled:
            text += f" ({self.num_unsampled} valid prompts not drawn into num_samples)"
        if not self.counts:
            return text + "; dropped none"
        parts = [
            f"{reason}: {count} (e.g. {', '.join(self.examples[reason])})"
            for reason, count in sorted(self.counts.items())
        ]
        return text + "; dropped " + "; ".join(parts)


@dataclass(slots=True)
class DropCounter:
    """Mutable tally used while loading; frozen into a DropReport at the end."""

    num_total: int = 0
    num_unsampled: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def drop(self, reason: str, prompt_id: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        ids = self.examples.setdefault(reason, [])
        if len(ids) < NUM_EXAMPLE_IDS:
            ids.append(prompt_id)

    def report(self) -> DropReport:
        return DropReport(
            num_total=self.num_total,
            num_unsampled=self.num_unsampled,
            counts=dict(self.counts),
            examples={reason: tuple(ids) for reason, ids in self.examples.items()},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptSet:
    """The result of ``load_prompts``: kept records in source order plus what was dropped."""

    records: list[PromptRecord]
    drops: DropReport
