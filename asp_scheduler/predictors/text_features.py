"""Fast CPU length predictor: hashed text n-grams + simple counts -> ridge regression on log length.

No torch and no sklearn: features are built with numpy in one vectorised pass over all prompts and
the ridge system is solved in closed form in whichever of the primal (features x features) or dual
(prompts x prompts) spaces is smaller.  Hashing uses a fixed 64-bit mixer and ``zlib.crc32`` (never
Python's salted ``hash()``), so the same prompts always give the same features and predictions.

Repeated samples of one prompt (traces with several samples per prompt) are collapsed to one row
per prompt before solving.  With squared loss, fitting every (prompt, sample) pair equals fitting
the per-prompt mean of log length weighted by the sample count (the within-prompt spread is a
constant), so ``aggregate="pairs"`` is that exact reduction at 1/k of the cost; ``"prompt_mean"``
instead fits log of the mean length with one unit weight per prompt.  ``benchmarks/predictor_quality.py``
measures both.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from asp_scheduler.predictors.base import PredictorQuality, PromptItem
from asp_scheduler.predictors.holdout import group_by_prompt, holdout_quality

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_PRIME = np.uint64(0x100000001B3)
_WORD_RE = re.compile(r"\\?[a-z]+|\d+|[^\sa-z\d]")
_BYTE_CLASSES = {1: b"0123456789", 2: b"+-*/=^_<>|", 3: b"\\", 4: b"$", 5: b".?!", 6: b"(){}[]"}
_NUM_BYTE_CLASSES = len(_BYTE_CLASSES) + 1
_BYTE_CLASS = np.zeros(256, dtype=np.int64)
for _cls, _chars in _BYTE_CLASSES.items():
    _BYTE_CLASS[np.frombuffer(_chars, dtype=np.uint8)] = _cls
NUM_NUMERIC_FEATURES = 3 + len(_BYTE_CLASSES) + 2
"""chars, lines, word tokens, one count per byte class, digit runs (log1p), digit fraction."""


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads the low-entropy polynomial hash over all 64 bits."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _fill_hashed_ngrams(
    out: np.ndarray, symbols: np.ndarray, row_lengths: np.ndarray, ngram_range: tuple[int, int]
) -> None:
    """Write signed hashed n-gram features of each row into ``out`` (rows, buckets), zero-initialised.

    ``symbols`` holds every row's symbols back to back; n-grams crossing a row boundary are masked.
    Counts get a sublinear ``sign*log1p(|c|)`` and each row unit L2 norm: which n-grams occur matters
    here, prompt length is carried by the numeric features.  Work stays on non-zeros only, because
    dense float64 temporaries of (rows x buckets) dominated the run time on a few thousand prompts.
    """
    num_rows, num_buckets = out.shape
    row_of = np.repeat(np.arange(num_rows), row_lengths)
    row_end = np.cumsum(row_lengths)[row_of]
    flats, signs = [], []
    for n in range(ngram_range[0], ngram_range[1] + 1):
        num_windows = symbols.shape[0] - n + 1
        if num_windows <= 0:
            continue
        h = np.full(num_windows, np.uint64(n) * _PRIME, dtype=np.uint64)
        for offset in range(n):
            h = h * _PRIME + symbols[offset : offset + num_windows]
        valid = np.arange(num_windows) + n <= row_end[:num_windows]
        h = _mix64(h[valid])
        signs.append(1.0 - 2.0 * (h & np.uint64(1)).astype(np.float64))
        # Multiply-shift maps the top 32 bits onto [0, num_buckets) without a slow 64-bit modulo.
        bucket = ((h >> np.uint64(32)) * np.uint64(num_buckets)) >> np.uint64(32)
        flats.append(row_of[:num_windows][valid] * num_buckets + bucket.astype(np.int64))
    if not flats:
        return
    # Accumulating straight into ``out`` (touched anyway) avoids a second dense buffer.
    flat = np.concatenate(flats)
    np.add.at(out, (flat // num_buckets, flat % num_buckets), np.concatenate(signs).astype(out.dtype))
    rows, cols = np.nonzero(out)
    counts = out[rows, cols].astype(np.float64)
    values = np.sign(counts) * np.log1p(np.abs(counts))
    norms = np.sqrt(np.bincount(rows, weights=values * values, minlength=num_rows))
    out[rows, cols] = values / norms[rows]


@dataclass(frozen=True, slots=True)
class _Tokenized:
    """Each text as hashed word symbols and lower-cased bytes, concatenated across texts."""

    word_symbols: np.ndarray
    word_counts: np.ndarray
    char_bytes: np.ndarray
    char_counts: np.ndarray
    line_counts: np.ndarray


def _tokenize(texts: Sequence[str]) -> _Tokenized:
    cache: dict[str, int] = {}
    symbols: list[int] = []
    word_counts = np.empty(len(texts), dtype=np.int64)
    for row, text in enumerate(texts):
        tokens = _WORD_RE.findall(text.lower())
        for token in tokens:
            code = cache.get(token)
            if code is None:
                code = cache[token] = zlib.crc32(token.encode("utf-8"))
            symbols.append(code)
        word_counts[row] = len(tokens)
    encoded = [" ".join(t.lower().split()).encode("utf-8") for t in texts]
    return _Tokenized(
        word_symbols=np.asarray(symbols, dtype=np.uint64),
        word_counts=word_counts,
        char_bytes=np.frombuffer(b"".join(encoded), dtype=np.uint8),
        char_counts=np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded)),
        line_counts=np.fromiter((t.count("\n") + 1 for t in texts), dtype=np.int64, count=len(texts)),
    )


def _numeric(tok: _Tokenized) -> np.ndarray:
    """Count features from byte classes, vectorised over all texts at once (no per-text regex)."""
    num_rows = tok.char_counts.shape[0]
    row_of = np.repeat(np.arange(num_rows), tok.char_counts)
    classes = _BYTE_CLASS[tok.char_bytes]
    per_class = np.bincount(row_of * _NUM_BYTE_CLASSES + classes, minlength=num_rows * _NUM_BYTE_CLASSES)
    per_class = per_class.reshape(num_rows, _NUM_BYTE_CLASSES)[:, 1:]
    is_digit = classes == 1
    starts = np.cumsum(tok.char_counts) - tok.char_counts
    run_start = is_digit & ~np.concatenate([[False], is_digit[:-1]])
    run_start[starts[tok.char_counts > 0]] = is_digit[starts[tok.char_counts > 0]]
    digit_runs = np.bincount(row_of[run_start], minlength=num_rows)
    counts = np.column_stack([tok.char_counts, tok.line_counts, tok.word_counts, per_class, digit_runs])
    digit_fraction = per_class[:, 0] / np.maximum(tok.char_counts, 1)
    return np.column_stack([np.log1p(counts.astype(np.float64)), digit_fraction])


def numeric_features(texts: Sequence[str]) -> np.ndarray:
    """Raw (unscaled) count features per text, shape (len(texts), NUM_NUMERIC_FEATURES)."""
    return _numeric(_tokenize(texts))


Aggregate = Literal["pairs", "prompt_mean"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TextFeatureConfig:
    word_ngrams: tuple[int, int] = (1, 2)
    """Inclusive range of word n-gram orders (tokens: words, numbers, LaTeX commands, symbols)."""
    char_ngrams: tuple[int, int] = (2, 4)
    """Inclusive range of character n-gram orders (lower-cased, whitespace collapsed)."""
    num_word_buckets: int = 1024
    """Hash buckets for word n-grams."""
    num_char_buckets: int = 1024
    """Hash buckets for character n-grams."""
    ridge_alpha: float = 10.0
    """L2 penalty; rows are weighted to mean 1, so it is on the scale of one prompt's squared error."""
    numeric_weight: float = 0.3
    """Scale of the standardised count features relative to the unit-norm n-gram blocks."""
    aggregate: Aggregate = "pairs"
    """How repeated samples of a prompt are combined (see module docstring)."""

    def __post_init__(self) -> None:
        for name in ("word_ngrams", "char_ngrams"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name}={(lo, hi)!r} must satisfy 1 <= min <= max, e.g. (1, 2)")
        if not (1 <= self.num_word_buckets < 2**31 and 1 <= self.num_char_buckets < 2**31):
            raise ValueError("num_word_buckets and num_char_buckets must be in [1, 2**31), e.g. 1024")
        if self.ridge_alpha <= 0 or self.numeric_weight < 0:
            raise ValueError("ridge_alpha must be > 0 and numeric_weight >= 0 (defaults: 10.0, 0.3)")
        if self.aggregate not in ("pairs", "prompt_mean"):
            raise ValueError(f"aggregate={self.aggregate!r}; use 'pairs' or 'prompt_mean'")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scaling:
    mean: np.ndarray
    std: np.ndarray


@dataclass(frozen=True, slots=True, kw_only=True)
class _RidgeModel:
    coef: np.ndarray
    intercept: float
    scaling: _Scaling
    log_range: tuple[float, float]


def _solve_weighted_ridge(
    features: np.ndarray, target: np.ndarray, weights: np.ndarray, alpha: float
) -> tuple[np.ndarray, float]:
    """argmin sum_i w_i (y_i - x_i.b - c)^2 + alpha |b|^2, intercept unpenalised."""
    # float32 for the big products (half the memory traffic of float64), float64 for the solve.
    w = weights / weights.mean()
    x_mean = (features.T @ w.astype(np.float32)) / np.float32(w.sum())
    y_mean = float(w @ target / w.sum())
    root_w = np.sqrt(w)
    xc = features - x_mean
    xc *= root_w.astype(np.float32)[:, None]
    yc = (target - y_mean) * root_w
    num_rows, num_features = xc.shape
    if num_rows <= num_features:
        gram = (xc @ xc.T).astype(np.float64)
        gram[np.diag_indices(num_rows)] += alpha
        coef = (xc.T @ np.linalg.solve(gram, yc).astype(np.float32)).astype(np.float64)
    else:
        gram = (xc.T @ xc).astype(np.float64)
        gram[np.diag_indices(num_features)] += alpha
        coef = np.linalg.solve(gram, (xc.T @ yc.astype(np.float32)).astype(np.float64))
    return coef, y_mean - float(x_mean.astype(np.float64) @ coef)


class TextFeaturePredictor:
    """``LengthPredictor``: ridge regression of log length on hashed n-grams and count features."""

    __slots__ = ("_model", "config", "name")

    def __init__(self, config: TextFeatureConfig | None = None) -> None:
        self.name = "text_features"
        self.config = config or TextFeatureConfig()
        self._model: _RidgeModel | None = None

    def _design(self, tok: _Tokenized, raw_numeric: np.ndarray, model: _Scaling) -> np.ndarray:
        """Float32 design matrix [word n-grams | char n-grams | scaled numeric], filled in place."""
        cfg = self.config
        num_words, num_chars = cfg.num_word_buckets, cfg.num_char_buckets
        num_rows = raw_numeric.shape[0]
        design = np.zeros((num_rows, num_words + num_chars + NUM_NUMERIC_FEATURES), dtype=np.float32)
        _fill_hashed_ngrams(design[:, :num_words], tok.word_symbols, tok.word_counts, cfg.word_ngrams)
        chars = tok.char_bytes.astype(np.uint64)
        _fill_hashed_ngrams(
            design[:, num_words : num_words + num_chars], chars, tok.char_counts, cfg.char_ngrams
        )
        design[:, num_words + num_chars :] = (raw_numeric - model.mean) / model.std * cfg.numeric_weight
        return design

    def fit(self, prompts: Sequence[PromptItem], lengths: np.ndarray) -> TextFeaturePredictor:
        groups = group_by_prompt(prompts, lengths)
        tok = _tokenize([p.text for p in groups.prompts])
        raw_numeric = _numeric(tok)
        std = raw_numeric.std(axis=0)
        scaling = _Scaling(mean=raw_numeric.mean(axis=0), std=np.where(std > 0, std, 1.0))
        if self.config.aggregate == "pairs":
            target, weights = groups.mean_log_length, groups.counts
        else:
            target, weights = groups.log_mean_length, np.ones_like(groups.counts)
        design = self._design(tok, raw_numeric, scaling)
        coef, intercept = _solve_weighted_ridge(design, target, weights, self.config.ridge_alpha)
        log_range = (float(target.min()), float(target.max()))
        self._model = _RidgeModel(coef=coef, intercept=intercept, scaling=scaling, log_range=log_range)
        return self

    def predict(self, prompts: Sequence[PromptItem]) -> np.ndarray:
        if self._model is None:
            raise ValueError(
                "TextFeaturePredictor.predict called before fit(); fit it on prompt-length pairs first"
            )
        if len(prompts) == 0:
            return np.empty(0, dtype=np.float64)
        m = self._model
        tok = _tokenize([p.text for p in prompts])
        log_pred = self._design(tok, _numeric(tok), m.scaling) @ m.coef.astype(np.float32) + m.intercept
        # Clipped to the training range: a ridge extrapolation in log space can explode after exp().
        return np.exp(np.clip(log_pred.astype(np.float64), *m.log_range))

    def fit_report(
        self, prompts: Sequence[PromptItem], lengths: np.ndarray, holdout_fraction: float = 0.2, seed: int = 0
    ) -> PredictorQuality:
        """Held-out quality on a prompt-grouped split, then refit on all pairs."""
        quality = holdout_quality(self, prompts, lengths, holdout_fraction=holdout_fraction, seed=seed)
        self.fit(prompts, lengths)
        return quality
