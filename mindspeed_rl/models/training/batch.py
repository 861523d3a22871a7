"""The training batch that crosses from the trainer into a training engine, and its padded form.

A :class:`TrainBatch` holds ragged per-sample lists (what the rollout produced); engines right-pad
it into tensors with :func:`pad_batch` only for the micro-batch they are about to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from mindspeed_rl.models.training.engine_config import TorchEngineConfig

IntSeq = Sequence[int] | np.ndarray
FloatSeq = Sequence[float] | np.ndarray


@dataclass(slots=True, frozen=True, kw_only=True)
class TrainBatch:
    """Samples ordered prompt group by group (the ``n`` samples of a prompt are contiguous).

    ``advantages`` holds one scalar per sample (GRPO broadcasts it over the response tokens).
    ``old_log_probs`` / ``ref_log_probs`` hold one value per *response* token, from the
    temperature-scaled distribution, like the rollout engines return them.
    ``rollout_log_probs`` are the behaviour policy's (the rollout engine's own, kept apart from
    ``old_log_probs`` for the off-policy correction) and ``versions`` the weights version that
    produced each response token.
    ``loss_masks`` (multi-turn rollouts) hold 1 for the policy's tokens and 0 for tool-response
    tokens: those stay in the sequence the log-probs are computed on, but no loss term (policy,
    KL, entropy, off-policy correction) counts them. None = every response token counts.
    """

    prompt_ids: tuple[np.ndarray, ...]
    response_ids: tuple[np.ndarray, ...]
    advantages: np.ndarray
    old_log_probs: tuple[np.ndarray, ...] | None = None
    ref_log_probs: tuple[np.ndarray, ...] | None = None
    rollout_log_probs: tuple[np.ndarray, ...] | None = None
    versions: tuple[np.ndarray, ...] | None = None
    loss_masks: tuple[np.ndarray, ...] | None = None
    routing: tuple[np.ndarray, ...] | None = None
    """MoE routing replay: per sample ``[prompt + response - 1, moe_layers, top_k]`` int64 expert ids
    (``runtime.routing``'s rows) the training forwards route by; None: the routers choose."""

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if len(self.response_ids) != n or self.advantages.shape != (n,):
            raise ValueError(
                f"TrainBatch needs one prompt, one response and one advantage per sample; got "
                f"{n} prompts, {len(self.response_ids)} responses, advantages of shape {self.advantages.shape}"
            )
        for i, (p, r) in enumerate(zip(self.prompt_ids, self.response_ids)):
            if p.size == 0 or r.size == 0:
                raise ValueError(
                    f"sample {i} has an empty prompt or response; the engine scores response tokens from the "
                    "position before them, so both need >= 1 token (drop empty responses before training)"
                )
        for name in ("old_log_probs", "ref_log_probs", "rollout_log_probs", "versions", "loss_masks"):
            values = getattr(self, name)
            if values is None:
                continue
            bad = [i for i, (lp, r) in enumerate(zip(values, self.response_ids)) if lp.shape != r.shape]
            if len(values) != n or bad:
                raise ValueError(
                    f"{name} must hold one value per response token for every sample (bad: {bad[:5]})"
                )
        if self.routing is not None:
            wrong = [
                i
                for i, (rows, p, r) in enumerate(zip(self.routing, self.prompt_ids, self.response_ids))
                if rows.ndim != 3 or rows.shape[0] != p.size + r.size - 1
            ]
            if len(self.routing) != n or wrong:
                raise ValueError(
                    "routing must hold [prompt + response - 1, moe_layers, top_k] expert ids for every sample "
                    f"(bad: {wrong[:5]})"
                )

    @classmethod
    def from_lists(
        cls,
        *,
        prompt_ids: Sequence[IntSeq],
        response_ids: Sequence[IntSeq],
        advantages: FloatSeq,
        old_log_probs: Sequence[FloatSeq] | None = None,
        ref_log_probs: Sequence[FloatSeq] | None = None,
        rollout_log_probs: Sequence[FloatSeq] | None = None,
        versions: Sequence[IntSeq] | None = None,
        loss_masks: Sequence[IntSeq] | None = None,
    ) -> TrainBatch:
        def ints(rows: Sequence[IntSeq]) -> tuple[np.ndarray, ...]:
            return tuple(np.asarray(r, dtype=np.int64).reshape(-1) for r in rows)

        def floats(rows: Sequence[FloatSeq] | None) -> tuple[np.ndarray, ...] | None:
            return None if rows is None else tuple(np.asarray(r, dtype=np.float32).reshape(-1) for r in rows)

        return cls(
            prompt_ids=ints(prompt_ids),
            response_ids=ints(response_ids),
            advantages=np.asarray(advantages, dtype=np.float32).reshape(-1),
            old_log_probs=floats(old_log_probs),
            ref_log_probs=floats(ref_log_probs),
            rollout_log_probs=floats(rollout_log_probs),
            versions=None if versions is None else ints(versions),
            loss_masks=None if loss_masks is None else ints(loss_masks),
        )

    @property
    def num_samples(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_response_tokens(self) -> int:
        return int(sum(r.size for r in self.response_ids))

    @property
    def num_loss_tokens(self) -> int:
        """Response tokens the loss counts: the policy's own (all of them without loss masks)."""
        if self.loss_masks is None:
            return self.num_response_tokens
        return int(sum(int(m.sum()) for m in self.loss_masks))

    def select(self, indices: Sequence[int] | np.ndarray) -> TrainBatch:
        idx = [int(i) for i in indices]

        def pick(rows: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...] | None:
            return None if rows is None else tuple(rows[i] for i in idx)

        return TrainBatch(
            prompt_ids=tuple(self.prompt_ids[i] for i in idx),
            response_ids=tuple(self.response_ids[i] for i in idx),
            advantages=self.advantages[idx],
            old_log_probs=pick(self.old_log_probs),
            ref_log_probs=pick(self.ref_log_probs),
            rollout_log_probs=pick(self.rollout_log_probs),
            versions=pick(self.versions),
            loss_masks=pick(self.loss_masks),
            routing=pick(self.routing),
        )

    def with_advantages(self, advantages: FloatSeq) -> TrainBatch:
        """A copy with new advantages (they come after reference log-probs when the KL shapes
        the reward)."""
        return replace(self, advantages=np.asarray(advantages, dtype=np.float32).reshape(-1))

    def with_routing(self, routing: Sequence[np.ndarray] | None) -> TrainBatch:
        """A copy whose forwards replay ``routing`` (None: the routers choose)."""
        rows = None if routing is None else tuple(np.asarray(r, dtype=np.int64) for r in routing)
        return replace(self, routing=rows)

    def with_log_probs(
        self, *, old: Sequence[np.ndarray] | None = None, ref: Sequence[np.ndarray] | None = None
    ) -> TrainBatch:
        """A copy with old and/or reference log-probs filled in (e.g. from ``compute_log_probs``)."""

        def floats(
            rows: Sequence[np.ndarray] | None, current: tuple[np.ndarray, ...] | None
        ) -> tuple[np.ndarray, ...] | None:
            return current if rows is None else tuple(np.asarray(x, dtype=np.float32) for x in rows)

        return replace(
            self, old_log_probs=floats(old, self.old_log_probs), ref_log_probs=floats(ref, self.ref_log_probs)
        )


@dataclass(slots=True, frozen=True, kw_only=True)
class PaddedBatch:
    """Right-padded tensors of one micro-batch.

    Sequences are ``prompt + response`` from position 0 (right padding keeps the default position
    ids correct). Response-aligned tensors are ``[B, R]`` with ``R`` the longest response; the logit
    that scores response token ``j`` of sample ``b`` sits at sequence position ``logit_index[b, j]``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_index: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    rollout_log_probs: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    """``[B, R]`` int64 weights version of each response token (padding: 0)."""
    loss_mask: torch.Tensor | None = None
    """``[B, R]`` 1 = a policy token, 0 = a tool-response token or padding; None = no tool tokens."""

    routing: tuple[np.ndarray, ...] | None = None
    """The micro-batch's ``TrainBatch.routing`` rows (laid out over ``input_ids`` by the engine
    that replays them: ``models.moe_routing.padded_routing``)."""

    @property
    def policy_mask(self) -> torch.Tensor:
        """The tokens every loss term counts: real response tokens the policy generated.
        ``response_mask`` alone still selects what log-probs are computed for."""
        return self.response_mask if self.loss_mask is None else self.response_mask * self.loss_mask


def _pad_rows(rows: Sequence[np.ndarray], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : row.size] = torch.from_numpy(row)
    return out


def pad_batch(batch: TrainBatch, *, pad_token_id: int, device: torch.device | str = "cpu") -> PaddedBatch:
    seqs = [np.concatenate([p, r]) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    width = max(s.size for s in seqs)
    resp_width = max(r.size for r in batch.response_ids)
    input_ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, : s.size] = torch.from_numpy(s)
        attention_mask[i, : s.size] = 1
    prompt_lens = torch.tensor([p.size for p in batch.prompt_ids], dtype=torch.long)
    offsets = torch.arange(resp_width, dtype=torch.long)
    # Clamp so padded response slots still index a valid position; they are masked out later.
    logit_index = torch.clamp(prompt_lens[:, None] - 1 + offsets[None, :], max=width - 1)
    response_mask = (offsets[None, :] < torch.tensor([r.size for r in batch.response_ids])[:, None]).long()

    def opt(rows: tuple[np.ndarray, ...] | None) -> torch.Tensor | None:
        return None if rows is None else _pad_rows(rows, resp_width, torch.float32).to(device)

    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        logit_index=logit_index.to(device),
        targets=_pad_rows(batch.response_ids, resp_width, torch.long).to(device),
        response_mask=response_mask.to(device),
        advantages=torch.from_numpy(batch.advantages).to(device),
        old_log_probs=opt(batch.old_log_probs),
        ref_log_probs=opt(batch.ref_log_probs),
        rollout_log_probs=opt(batch.rollout_log_probs),
        versions=None
        if batch.versions is None
        else _pad_rows(batch.versions, resp_width, torch.long).to(device),
        loss_mask=None
        if batch.loss_masks is None
        else _pad_rows(batch.loss_masks, resp_width, torch.long).to(device),
        routing=batch.routing,
    )


def check_update_batch(batch: TrainBatch, config: TorchEngineConfig) -> int:
    """Optimizer steps ``update`` will run on ``batch``; ValueError naming the fix when it cannot."""
    size = config.samples_per_mini_batch
    if batch.num_samples % size != 0:
        raise ValueError(
            f"{batch.num_samples} samples do not split into mini-batches of mini_batch_size x n = {size}; "
            "make megatron_training.global_batch_size a multiple of rl_config.mini_batch_size"
        )
    num_steps = batch.num_samples // size * config.epochs
    if batch.old_log_probs is None and num_steps > 1:
        raise ValueError(
            f"update runs {num_steps} optimizer steps, so it needs the behaviour policy's old_log_probs "
            "(from compute_log_probs or the rollout); they may be omitted only for one mini-batch x one epoch"
        )
    if batch.ref_log_probs is None and config.loss.kl_in_loss:
        raise ValueError(
            "init_kl_coef > 0 needs ref_log_probs in the batch (ReferenceModel.compute_log_probs); "
            "or set rl_config.init_kl_coef: 0"
        )
    if config.loss.rollout_correction is not None and (
        batch.rollout_log_probs is None or batch.versions is None
    ):
        raise ValueError(
            "rollout_correction needs the behaviour policy's log-probs and versions in the batch "
            "(TrainBatch.rollout_log_probs and versions, filled from each sample by the Training Unit)"
        )
    return num_steps


def mini_batches(batch: TrainBatch, config: TorchEngineConfig, *, update_index: int) -> Iterator[TrainBatch]:
    """The mini-batches one ``update`` steps the optimizer on, in order: ``epochs`` passes over
    ``batch`` in slices of ``samples_per_mini_batch``, each pass reshuffled when
    ``shuffle_mini_batch``. The shuffle is seeded by ``(seed, update_index)``, so a resumed run
    (which restores the update count) shuffles exactly as the uninterrupted one would.
    ``check_update_batch`` first: it says how many there will be, or why there cannot be."""
    rng = np.random.default_rng((config.seed, update_index))
    size = config.samples_per_mini_batch
    for _ in range(config.epochs):
        order = (
            rng.permutation(batch.num_samples) if config.shuffle_mini_batch else np.arange(batch.num_samples)
        )
        for start in range(0, batch.num_samples, size):
            yield batch.select(order[start : start + size])
