"""The simulated workload: every prompt's ``n`` response lengths, from a trace or synthetic.

A prompt's ``n`` samples are decoded in the same minibatch and consumed in the same global batch,
so the workload is a ``(num_prompts, n)`` matrix of response lengths. The scheduler sees one
number per prompt: the mean of its ``n`` lengths is the "true" length the noisy oracle blurs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    prompt_ids: tuple[str, ...]
    lengths: np.ndarray
    """``(num_prompts, n)`` response lengths in tokens (int64, >= 1), in file/draw order."""
    source: str

    def __post_init__(self) -> None:
        if self.lengths.ndim != 2 or self.lengths.shape[0] != len(self.prompt_ids):
            raise ValueError(
                f"lengths must have shape (num_prompts={len(self.prompt_ids)}, n), got {self.lengths.shape}."
            )
        if self.lengths.size == 0 or int(self.lengths.min()) < 1:
            raise ValueError("every response length must be >= 1 token; fix or drop zero-length rows.")
        if len(set(self.prompt_ids)) != len(self.prompt_ids):
            raise ValueError("prompt ids must be unique; each prompt is one schedulable item.")

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_samples_per_prompt(self) -> int:
        return int(self.lengths.shape[1])

    @property
    def prompt_lengths(self) -> np.ndarray:
        """One length per prompt (mean over its samples): what a length predictor targets."""
        return self.lengths.mean(axis=1)

    def head(self, num_prompts: int) -> Workload:
        """The first ``num_prompts`` prompts (a smaller run of the same workload)."""
        if not 1 <= num_prompts <= self.num_prompts:
            raise ValueError(f"num_prompts must be in [1, {self.num_prompts}], got {num_prompts}.")
        return Workload(
            prompt_ids=self.prompt_ids[:num_prompts],
            lengths=self.lengths[:num_prompts],
            source=f"{self.source} (first {num_prompts} prompts)",
        )


def load_trace(
    path: str | Path,
    *,
    length_field: str = "response_tokens",
    id_field: str = "prompt_id",
    scale: float = 1.0,
    group_by_prompt: bool = True,
) -> Workload:
    """Read a JSONL length trace (one row per sampled response).

    ``group_by_prompt``: rows sharing ``id_field`` are one prompt's samples (``n`` = rows per
    prompt, which must be the same for every prompt); otherwise every row is its own prompt with
    ``n = 1``. ``scale`` multiplies every length (rounded, at least 1 token), e.g. to shrink a
    real trace to what a CPU replay can afford.
    """
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}; 1.0 keeps the trace's lengths.")
    rows = _read_rows(Path(path), length_field, id_field)
    if group_by_prompt:
        groups: dict[str, list[int]] = {}
        for prompt_id, length in rows:
            groups.setdefault(prompt_id, []).append(length)
        counts = {len(v) for v in groups.values()}
        if len(counts) != 1:
            raise ValueError(
                f"{path}: prompts have different sample counts {sorted(counts)}; every prompt needs the same "
                "n, or pass group_by_prompt=False (--rows-as-prompts) to treat each row as a prompt."
            )
        ids, matrix = list(groups), np.array(list(groups.values()), dtype=np.float64)
    else:
        ids = [f"{pid}#{i}" for i, (pid, _) in enumerate(rows)]
        matrix = np.array([[length] for _, length in rows], dtype=np.float64)
    scaled = np.maximum(1, np.rint(matrix * scale)).astype(np.int64)
    return Workload(prompt_ids=tuple(ids), lengths=scaled, source=f"{path} (scale {scale:g})")


def _read_rows(path: Path, length_field: str, id_field: str) -> list[tuple[str, int]]:
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist; pass a JSONL with one row per response.")
    rows: list[tuple[str, int]] = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if length_field not in record or id_field not in record:
            raise ValueError(
                f"{path}:{line_no}: needs fields '{id_field}' and '{length_field}'; "
                "set --id-field/--length-field to the trace's names."
            )
        length = record[length_field]
        if not isinstance(length, int | float) or length < 1:
            raise ValueError(f"{path}:{line_no}: {length_field}={length!r} is not a length >= 1.")
        rows.append((str(record[id_field]), int(length)))
    if not rows:
        raise ValueError(f"trace file {path} has no rows.")
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticWorkload:
    """Log-normal prompt lengths with log-normal per-sample spread, clipped to ``[1, max_tokens]``."""

    num_prompts: int
    num_samples_per_prompt: int
    median_tokens: float
    prompt_sigma: float = 0.6
    """Log-space spread of prompt means (how different prompts are)."""
    sample_sigma: float = 0.3
    """Log-space spread of one prompt's samples around its mean (sampling noise)."""
    max_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.num_prompts < 2 or self.num_samples_per_prompt < 1:
            raise ValueError("synthetic workload needs num_prompts >= 2 and num_samples_per_prompt >= 1.")
        if self.median_tokens < 1 or self.max_tokens < 1:
            raise ValueError("median_tokens and max_tokens must be >= 1.")
        if self.prompt_sigma < 0 or self.sample_sigma < 0:
            raise ValueError("prompt_sigma and sample_sigma are log-space STDs and must be >= 0.")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SyntheticWorkload:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in workload.synthetic; valid keys: {sorted(known)}.")
        return cls(**dict(data))

    def draw(self, seed: int) -> Workload:
        rng = np.random.default_rng([seed, 7])
        means = self.median_tokens * np.exp(self.prompt_sigma * rng.standard_normal(self.num_prompts))
        shape = (self.num_prompts, self.num_samples_per_prompt)
        raw = means[:, None] * np.exp(self.sample_sigma * rng.standard_normal(shape))
        lengths = np.clip(np.rint(raw), 1, self.max_tokens).astype(np.int64)
        ids = tuple(f"s{i}" for i in range(self.num_prompts))
        return Workload(prompt_ids=ids, lengths=lengths, source=f"synthetic(seed={seed}, {self})")
