"""Vocab-parallel log-probs on one rank (group None) against plain log_softmax; padding excluded."""

from __future__ import annotations

import pytest
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
    torch.testing.assert_close(lp, torch.full((1, 2), -float(torch.log(torch.tensor(4.0)))))


# Over a real 2-rank gloo group: each rank holds half of a padded vocabulary (13 real ids, 14
# columns, so rank 1 holds one padding column). Near-uniform logits (entropy ~log 13) and peaked
# ones (entropy 0.003 to 0.9): a normaliser gradient missing the other rank's share errs by
# p_v (E_local[s] - E[s]), which the two regimes make large and small in different columns.
_VOCAB, _LOCAL = 13, 7
_SCALES = {"near_uniform": 0.02, "peaked": 8.0}


def _gloo_inputs(scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "logits": scale * torch.randn(3, 5, _VOCAB, generator=g, dtype=torch.float64),
        # Both ranks own some targets: ids below and above the split.
        "targets": torch.randint(0, _VOCAB, (3, 5), generator=g),
        "lp_weight": torch.randn(3, 5, generator=g, dtype=torch.float64),
        "ent_weight": torch.randn(3, 5, generator=g, dtype=torch.float64),
    }


def _gloo_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from benchmarks.parity.engine import init_gloo

    init_gloo(rank, 2, port)
    try:
        results = {}
        for name, scale in _SCALES.items():
            inp = _gloo_inputs(scale)
            padded = torch.cat([inp["logits"].float(), torch.full((3, 5, 2 * _LOCAL - _VOCAB), 30.0)], -1)
            mine = padded[..., rank * _LOCAL : (rank + 1) * _LOCAL].clone().requires_grad_(True)
            lp, ent = vocab_parallel_log_probs(
                mine,
                inp["targets"],
                vocab_start=rank * _LOCAL,
                vocab_size=_VOCAB,
                group=dist.group.WORLD,
                with_entropy=True,
            )
            assert ent is not None
            lp_loss = (inp["lp_weight"].float() * lp).sum()
            ent_loss = (inp["ent_weight"].float() * ent).sum()
            grads = {
                "logp": torch.autograd.grad(lp_loss, mine, retain_graph=True)[0],
                "entropy": torch.autograd.grad(ent_loss, mine, retain_graph=True)[0],
                "mixed": torch.autograd.grad(lp_loss + ent_loss, mine)[0],
            }
            out: dict[str, torch.Tensor] = {"log_probs": lp.detach(), "entropy": ent.detach()}
            for loss_name, grad in grads.items():
                parts = [torch.empty_like(grad) for _ in range(2)]
                dist.all_gather(parts, grad.contiguous())
                out[f"grad_{loss_name}"] = torch.cat(parts, dim=-1)
            for key in ("log_probs", "entropy"):  # every rank must hold the same values
                parts = [torch.empty_like(out[key]) for _ in range(2)]
                dist.all_gather(parts, out[key])
                out[f"{key}_rank_diff"] = (parts[0] - parts[1]).abs().max().reshape(1)
            results[name] = out
        if rank == 0:
            torch.save(results, f"{out_dir}/results.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    from benchmarks.parity import ranks
    from benchmarks.parity.engine import free_port

    out = tmp_path_factory.mktemp("vocab_parallel_gloo")
    ranks.start_ranks(_gloo_worker, (free_port(), str(out)), 2)
    results: dict[str, dict[str, torch.Tensor]] = torch.load(out / "results.pt")
    return results


@pytest.mark.parametrize("regime", sorted(_SCALES))
def test_two_rank_values_and_logit_gradients_match_full_vocab_softmax(
    gloo_results: dict[str, dict[str, torch.Tensor]], regime: str
) -> None:
    """Values and d loss / d logits (log-prob, entropy and mixed losses) of the 2-rank computation
    against full-vocabulary float64 log_softmax; padding columns get exactly zero gradient."""
    got = gloo_results[regime]
    inp = _gloo_inputs(_SCALES[regime])
    logits = inp["logits"].clone().requires_grad_(True)
    want_lp, want_ent = _reference(logits, inp["targets"])
    lp_loss = (inp["lp_weight"] * want_lp).sum()
    ent_loss = (inp["ent_weight"] * want_ent).sum()
    want_grads = {
        "logp": torch.autograd.grad(lp_loss, logits, retain_graph=True)[0],
        "entropy": torch.autograd.grad(ent_loss, logits, retain_graph=True)[0],
        "mixed": torch.autograd.grad(lp_loss + ent_loss, logits)[0],
    }
    assert float(got["log_probs_rank_diff"]) == 0.0 and float(got["entropy_rank_diff"]) == 0.0
    # fp32 noise (measured: values <= 1.6e-6 off, peaked log-probs reaching -31).
    torch.testing.assert_close(got["log_probs"].double(), want_lp.detach(), atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(got["entropy"].double(), want_ent.detach(), atol=2e-6, rtol=1e-6)
    for loss_name, want in want_grads.items():
        grad = got[f"grad_{loss_name}"]

        def msg(m: str, n: str = loss_name) -> str:
            return f"{n} loss: {m}"

        assert torch.equal(grad[..., _VOCAB:], torch.zeros_like(grad[..., _VOCAB:])), loss_name
        # Relative to the gradient's scale: near-uniform, d H / d z_v = -p_v (log p_v + H) cancels
        # two terms of size log V, which leaves ~4e-6 of max |g| in fp32 (measured).
        torch.testing.assert_close(
            grad[..., :_VOCAB].double(),
            want,
            atol=3e-5 * float(want.abs().max()),
            rtol=0,
            msg=msg,
        )
