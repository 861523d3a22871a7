"""Rollout engine on a plain transformers model: the light backend for fast tests and any device.

We drive the HF model's forward pass with our own decode loop instead of `model.generate`,
because GRPO rollouts need what `generate` cannot give per row: a separate max_tokens and
min_tokens for each prompt, EOS ignored on request, and the exact log-prob of each sampled token
under vLLM's processing order (`sampling.py`), so that both engines are interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mindspeed_rl.models.rollout.base import (
    Completion,
    SamplingConfig,
    check_num_samples,
    check_weight_names,
    resolve_max_tokens,
)
from mindspeed_rl.models.rollout.sampling import SamplingStep, processed_log_probs, sample_tokens
from mindspeed_rl.models.training.hf_names import checkpoint_names, to_model_state

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    prompt: Sequence[int]
    max_tokens: int
    min_tokens: int


class HFEngine:
    """`RolloutEngine` over `AutoModelForCausalLM`; rows are batched up to `max_num_seqs` at a time."""

    def __init__(
        self,
        model_path: str,
        *,
        seed: int = 0,
        dtype: str = "float32",
        device: str = "cpu",
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        num_threads: int | None = 1,
        record_routing: bool = False,
    ) -> None:
        """`record_routing`: every completion carries the MoE routing of its prompt and response
        (``Completion.routing``; a Qwen3-MoE model only, ``models.moe_routing``).
        `num_threads` sets torch's intra-op pool on CPU (process-wide): 1 avoids OpenMP spin-wait
        contention between actors sharing few cores (measured: 2 threads under load ran ~70x slower)."""
        from transformers import AutoModelForCausalLM

        from mindspeed_rl.models.transformers_compat import load_config

        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
        if num_threads is not None and torch.device(device).type == "cpu":
            torch.set_num_threads(num_threads)
        # Eager attention: with left padding, fully masked pad rows stay finite (sdpa can emit NaN
        # there, which would then leak into later layers through the KV cache).
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            model_path,
            config=load_config(model_path),  # transformers 4.x would misread a 5.x config's RoPE base
            dtype=dtype if dtype == "auto" else getattr(torch, dtype),
            attn_implementation="eager",
        )
        torch.nn.Module.to(model, torch.device(device))
        model.eval()
        self._attach(
            model,
            seed=seed,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            record_routing=record_routing,
        )

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        *,
        seed: int = 0,
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        record_routing: bool = False,
    ) -> HFEngine:
        """An engine over a model already in memory (e.g. the trainer's live policy), no copy.

        The caller owns the model's state: put it in eval mode and eager attention for the call
        (see ``__init__`` for why eager), and restore both afterwards.
        """
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
        engine = cls.__new__(cls)
        engine._attach(
            model,
            seed=seed,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            record_routing=record_routing,
        )
        return engine

    def _attach(
        self,
        model: PreTrainedModel,
        *,
        seed: int,
        max_num_seqs: int,
        max_model_len: int | None,
        record_routing: bool = False,
    ) -> None:
        from mindspeed_rl.models.moe_routing import RouterHooks

        self._model = model
        self._routing = RouterHooks(model) if record_routing else None
        self._device = next(model.parameters()).device
        config = self._model.config
        self._max_model_len = int(max_model_len or config.max_position_embeddings)
        self._stop_ids = _stop_token_ids(self._model)
        self._pad_id = int(config.pad_token_id if config.pad_token_id is not None else min(self._stop_ids))
        self._max_num_seqs = max_num_seqs
        self._generator = torch.Generator(device=self._device).manual_seed(seed)
        # Checkpoint names (tied lm_head left out, MoE experts per expert): what snapshots carry.
        self._weight_names = checkpoint_names(self._model)

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        n: int = 1,
        max_tokens_per_prompt: Sequence[int] | None = None,
        stop_token_sequences: Sequence[Sequence[int]] = (),
    ) -> list[list[Completion]]:
        """``stop_token_sequences``: a row also stops (finish_reason "stop") right after its
        tokens end with one of these (the agent loop's tool-call close); they stay in the output."""
        check_num_samples(n)
        stops = [
            torch.tensor(list(seq), dtype=torch.long, device=self._device) for seq in stop_token_sequences
        ]
        if any(seq.numel() == 0 for seq in stops):
            raise ValueError("stop_token_sequences holds an empty sequence; every stop needs >= 1 token")
        if sampling.repetition_penalty != 1.0:
            raise ValueError(
                f"repetition_penalty={sampling.repetition_penalty} is not implemented by the HF engine; "
                "set it to 1.0 or use the vllm backend"
            )
        limits = resolve_max_tokens(prompts, sampling, max_tokens_per_prompt, self._max_model_len)
        rows = [
            _Row(prompt=p, max_tokens=m, min_tokens=min(sampling.min_tokens, m))
            for p, m in zip(prompts, limits)
            for _ in range(n)
        ]
        generator = self._generator
        if sampling.seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(sampling.seed)
        step = SamplingStep(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p
        )
        flat: list[Completion] = []
        for start in range(0, len(rows), self._max_num_seqs):
            chunk = rows[start : start + self._max_num_seqs]
            flat.extend(self._generate_chunk(chunk, step, sampling.ignore_eos, generator, stops))
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_chunk(
        self,
        rows: Sequence[_Row],
        step: SamplingStep,
        ignore_eos: bool,
        generator: torch.Generator,
        stops: Sequence[torch.Tensor] = (),
    ) -> list[Completion]:
        if self._routing is None:
            return self._decode(rows, step, ignore_eos, generator, stops)
        with self._routing.capture() as calls:
            completions = self._decode(rows, step, ignore_eos, generator, stops)
        return _with_routing(completions, rows, calls)

    def _decode(
        self,
        rows: Sequence[_Row],
        step: SamplingStep,
        ignore_eos: bool,
        generator: torch.Generator,
        stops: Sequence[torch.Tensor] = (),
    ) -> list[Completion]:
        input_ids, attention = self._left_pad([r.prompt for r in rows])
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        max_tokens = torch.tensor([r.max_tokens for r in rows], device=self._device)
        min_tokens = torch.tensor([r.min_tokens for r in rows], device=self._device)
        stop_ids = torch.tensor(sorted(self._stop_ids), device=self._device)
        tokens: list[torch.Tensor] = []
        log_probs: list[torch.Tensor] = []
        done = torch.zeros(len(rows), dtype=torch.bool, device=self._device)
        stopped = torch.zeros_like(done)
        lengths = torch.zeros(len(rows), dtype=torch.long, device=self._device)
        out = self._model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True
        )
        for t in range(int(max_tokens.max())):
            logits = out.logits[:, -1, :].float()
            below_min = (min_tokens > t).unsqueeze(-1) & torch.isin(
                torch.arange(logits.shape[-1], device=self._device), stop_ids
            )
            logits = logits.masked_fill(below_min, float("-inf"))
            token, token_lp = sample_tokens(processed_log_probs(logits, step), step, generator)
            token = torch.where(done, torch.full_like(token, self._pad_id), token)
            tokens.append(token)
            log_probs.append(token_lp)
            if not ignore_eos:
                stopped |= ~done & torch.isin(token, stop_ids)
            for seq in stops:
                if len(tokens) >= seq.numel():
                    tail = torch.stack(tokens[-seq.numel() :], dim=1)
                    stopped |= ~done & (tail == seq).all(dim=1)
            now_done = done | stopped | (t + 1 >= max_tokens)
            lengths = torch.where(now_done & ~done, t + 1, lengths)
            done = now_done
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
            positions = positions[:, -1:] + 1
            out = self._model(
                input_ids=token.unsqueeze(-1),
                attention_mask=attention,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        return _collect(torch.stack(tokens, dim=1), torch.stack(log_probs, dim=1), lengths, stopped)

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return ids.to(self._device), mask.to(self._device)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        tensors = dict(named_tensors)
        check_weight_names(tensors.keys(), self._weight_names)
        self._model.load_state_dict(to_model_state(tensors, self._model), strict=True)

    def load_weights_from_path(self, path: str) -> None:
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors files in {path}; pass a folder saved by save_pretrained")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        self.load_weights(state.items())

    def shutdown(self) -> None:
        # Nothing to release beyond memory; drop the model so a long-lived actor frees it.
        del self._model


def _stop_token_ids(model: PreTrainedModel) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, model.config.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    if not ids:
        raise ValueError("the model defines no eos_token_id; set it in config.json or generation_config.json")
    return frozenset(ids)


def _with_routing(
    completions: list[Completion], rows: Sequence[_Row], calls: list[list[torch.Tensor]]
) -> list[Completion]:
    """Attach each row's routing: its prompt's rows of the prefill (left-padded to the chunk's
    longest prompt), then one row per response token fed back in (all but the last)."""
    import dataclasses

    from mindspeed_rl.models.moe_routing import stack_calls

    width = max(len(r.prompt) for r in rows)
    prefill = stack_calls(calls, 0).reshape(len(rows), width, len(calls), -1)
    steps = [stack_calls(calls, t) for t in range(1, len(calls[0]))]  # each [rows, layers, top_k]
    out = []
    for i, (row, completion) in enumerate(zip(rows, completions)):
        fed = len(completion.token_ids) - 1
        parts = [prefill[i, width - len(row.prompt) :], *(steps[t][i : i + 1] for t in range(fed))]
        routing = torch.cat(parts, dim=0).cpu().numpy()
        out.append(dataclasses.replace(completion, routing=routing))
    return out


def _collect(
    tokens: torch.Tensor, log_probs: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor
) -> list[Completion]:
    completions = []
    for i in range(tokens.shape[0]):
        n = int(lengths[i])
        completions.append(
            Completion(
                tuple(int(x) for x in tokens[i, :n].tolist()),
                tuple(float(x) for x in log_probs[i, :n].tolist()),
                "stop" if bool(stopped[i]) else "length",
            )
        )
    return completions
