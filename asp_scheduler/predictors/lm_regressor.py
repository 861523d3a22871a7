"""Length predictor that fine-tunes a local HF causal LM with a scalar regression head.

This is the paper's predictor family (it fine-tunes Qwen2.5-1.5B on 4,000 prompt-length pairs).
``AutoModelForSequenceClassification(num_labels=1)`` puts a linear head on the last non-pad token;
the target is standardised log length with a weighted MSE.  Repeated samples of one prompt are
collapsed to their mean log length weighted by the sample count, which is the same loss as training
on every pair (up to a constant) at a fraction of the forward passes.

torch and transformers are imported inside methods only, so ``asp_scheduler`` stays importable (and
fast to import) where they are missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asp_scheduler.predictors.base import PredictorQuality, PromptItem
from asp_scheduler.predictors.holdout import group_by_prompt, holdout_quality

_META_FILE = "length_regressor.json"
_META_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class LMRegressorConfig:
    epochs: int = 3
    """Passes over the distinct training prompts."""
    lr: float = 2e-5
    """AdamW learning rate (2e-5 suits a pretrained 1.5B model; tiny random models need ~1e-3)."""
    batch_size: int = 8
    """Prompts per optimizer step (and per forward pass at prediction time)."""
    max_prompt_tokens: int = 512
    """Longer prompts keep their LAST tokens: the head reads the final token, where the question ends."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm."""
    seed: int = 0
    """Seeds the head initialisation and the shuffling, so a fit is reproducible on one device."""
    device: str = "cpu"
    """torch device string, e.g. "cpu", "cuda:0", "npu:0"."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.max_prompt_tokens < 1:
            raise ValueError("epochs, batch_size and max_prompt_tokens must be >= 1 (defaults: 3, 8, 512)")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError("lr and grad_clip must be > 0 and weight_decay >= 0 (defaults: 2e-5, 1.0, 0.0)")


@dataclass(frozen=True, slots=True, kw_only=True)
class _TargetScale:
    """Standardisation of log length, saved next to the weights so predictions can be undone."""

    mean: float
    std: float
    log_min: float
    log_max: float


class LMRegressor:
    """``LengthPredictor`` backed by a fine-tuned HF sequence-regression model."""

    __slots__ = ("_model", "_scale", "_tokenizer", "config", "model_path", "name", "train_losses")

    def __init__(self, model_path: str | os.PathLike[str], config: LMRegressorConfig | None = None) -> None:
        self.name = "lm_regressor"
        self.model_path = Path(model_path)
        self.config = config or LMRegressorConfig()
        if not (self.model_path / "config.json").is_file():
            raise ValueError(
                f"{self.model_path}: not a Hugging Face model folder (no config.json); "
                "pass a local folder written by save_pretrained()"
            )
        self._model: Any = None
        self._tokenizer: Any = None
        self._scale: _TargetScale | None = None
        self.train_losses: list[float] = []
        """Weighted MSE (standardised log units) of each epoch of the last fit."""

    def _load_pretrained(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"{path}: tokenizer has neither a pad nor an eos token; add a pad token to it"
                )
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "left"
        torch.manual_seed(self.config.seed)  # the fresh regression head is drawn here
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        # The head pools the last token that is not padding, so the model must know the pad id.
        model.config.pad_token_id = tokenizer.pad_token_id
        model.config.problem_type = "regression"
        self._model = model.to(self.config.device)
        self._tokenizer = tokenizer

    def _batch(self, texts: Sequence[str]) -> dict[str, Any]:
        encoded = self._tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.config.max_prompt_tokens,
            return_tensors="pt",
        )
        return {
            k: v.to(self.config.device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")
        }

    def fit(self, prompts: Sequence[PromptItem], lengths: np.ndarray) -> LMRegressor:
        """Fine-tune a fresh copy of ``model_path`` (every call starts from the original weights)."""
        groups = group_by_prompt(prompts, lengths)
        target, weights = groups.mean_log_length, groups.counts
        mean = float(np.average(target, weights=weights))
        std = float(np.sqrt(np.average((target - mean) ** 2, weights=weights)))
        self._scale = _TargetScale(
            mean=mean,
            std=std if std > 1e-6 else 1.0,
            log_min=float(target.min()),
            log_max=float(target.max()),
        )
        self._load_pretrained(self.model_path)
        texts = [p.text for p in groups.prompts]
        self.train_losses = self._train(texts, (target - mean) / self._scale.std, weights / weights.mean())
        return self

    def _train(self, texts: list[str], target: np.ndarray, weights: np.ndarray) -> list[float]:
        import torch

        cfg = self.config
        optimizer = torch.optim.AdamW(self._model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        rng = np.random.default_rng(cfg.seed)
        y = torch.as_tensor(target, dtype=torch.float32, device=cfg.device)
        w = torch.as_tensor(weights, dtype=torch.float32, device=cfg.device)
        self._model.train()
        losses = []
        for _ in range(cfg.epochs):
            order = rng.permutation(len(texts))
            total = 0.0
            for start in range(0, len(texts), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                out = self._model(**self._batch([texts[i] for i in idx])).logits.squeeze(-1)
                index = torch.as_tensor(idx, device=cfg.device)
                loss = (w[index] * (out - y[index]) ** 2).sum() / w[index].sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self._model.parameters(), cfg.grad_clip)
                optimizer.step()
                total += float(loss.detach()) * float(w[index].sum())
            losses.append(total / float(w.sum()))
        self._model.eval()
        return losses

    def predict(self, prompts: Sequence[PromptItem]) -> np.ndarray:
        import torch

        if self._model is None or self._scale is None:
            raise ValueError(
                "LMRegressor.predict called before fit() or load(); fit or load a predictor first"
            )
        # One forward pass per distinct prompt; repeated samples share it.
        unique = list(dict.fromkeys(p.text for p in prompts))
        outputs = np.empty(len(unique), dtype=np.float64)
        with torch.no_grad():
            for start in range(0, len(unique), self.config.batch_size):
                chunk = unique[start : start + self.config.batch_size]
                logits = self._model(**self._batch(chunk)).logits.squeeze(-1)
                outputs[start : start + len(chunk)] = logits.double().cpu().numpy()
        s = self._scale
        # Clipped to the training range: a regression head can extrapolate wildly in log space.
        log_pred = np.clip(outputs * s.std + s.mean, s.log_min, s.log_max)
        by_text = dict(zip(unique, np.exp(log_pred)))
        return np.fromiter((by_text[p.text] for p in prompts), dtype=np.float64, count=len(prompts))

    def fit_report(
        self, prompts: Sequence[PromptItem], lengths: np.ndarray, holdout_fraction: float = 0.2, seed: int = 0
    ) -> PredictorQuality:
        """Held-out quality on a prompt-grouped split, then refit on all pairs (two fine-tunes)."""
        quality = holdout_quality(self, prompts, lengths, holdout_fraction=holdout_fraction, seed=seed)
        self.fit(prompts, lengths)
        return quality

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write weights + tokenizer (HF format) and the target scaling to ``directory``."""
        if self._model is None or self._scale is None:
            raise ValueError("LMRegressor.save called before fit(); fit the predictor first")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._model.save_pretrained(out)
        self._tokenizer.save_pretrained(out)
        meta = {"version": _META_VERSION, "target_scale": asdict(self._scale), "config": asdict(self.config)}
        (out / _META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, device: str | None = None) -> LMRegressor:
        """Restore a predictor written by :meth:`save`; ``device`` overrides the saved one."""
        path = Path(directory)
        meta_path = path / _META_FILE
        if not meta_path.is_file():
            raise ValueError(f"{path}: no {_META_FILE}; pass a folder written by LMRegressor.save()")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("version") != _META_VERSION:
            raise ValueError(
                f"{meta_path}: version {meta.get('version')!r} is not {_META_VERSION}; re-save it"
            )
        settings = dict(meta["config"])
        if device is not None:
            settings["device"] = device
        predictor = cls(path, LMRegressorConfig(**settings))
        predictor._scale = _TargetScale(**meta["target_scale"])
        predictor._load_pretrained(path)
        predictor._model.eval()
        return predictor
