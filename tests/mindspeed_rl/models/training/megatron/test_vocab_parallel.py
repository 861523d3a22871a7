"""Vocab-parallel log-probs on one rank (group None) against plain log_softmax; padding excluded."""

from __future__ import annotations

import torch

from mindspeed_rl.models.training.megatron.vocab_parallel import vocab_parallel_log_probs


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_single_rank_matches_log_softmax_values_and_gradients() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    got_lp, got_ent = vocab_parallel_log_probs(
        logits, targets, vocab_start=0, vocab_size=11, group=None, with_entropy=True
    )
    want_lp, want_ent = _reference(logits.float(), targets)
    assert got_ent is not None
    torch.testing.assert_close(got_lp, want_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-6, rtol=0)
    (g_got,) = torch.autograd.grad((got_lp.sum() + got_ent.sum()), logits)
    (g_want,) = torch.autograd.grad((want_lp.sum() + want_ent.sum()), logits)
    torch.testing.assert_close(g_got, g_want.to(g_got.dtype), atol=1e-5, rtol=0)


def test_padded_vocabulary_columns_do_not_count() -> None:
    torch.manual_seed(1)
    real = torch.randn(2, 4, 7)
    padded = torch.cat([real, torch.full((2, 4, 5), 30.0)], dim=-1)  # huge logits on padding
    targets = torch.randint(0, 7, (2, 4))
    got_lp, got_ent = vocab_parallel_log_probs(
        padded, targets, vocab_start=0, vocab_size=7, group=None, with_entropy=True
    )
    want_lp, want_ent = _reference(real, targets)
    assert got_ent is not None and torch.isfinite(got_ent).all()
    torch.testing.assert_close(got_lp, want_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-6, rtol=0)


def test_without_entropy_returns_none() -> None:
    lp, ent = vocab_parallel_log_probs(
        torch.zeros(1, 2, 4),
        torch.zeros(1, 2, dtype=torch.long),
        vocab_start=0,
        vocab_size=4,
        group=None,
        with_entropy=False,
    )
    assert ent is None
    torch.testing.assert_close(lp, torch.full((1, 2), -torch.log(torch.tensor(4.0))))
