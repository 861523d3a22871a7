from pathlib import Path

import numpy as np

from mindspeed_rl.models.tiny import build_char_tokenizer
from mindspeed_rl.models.training.reference import ReferenceModel
from mindspeed_rl.models.training.sft_warmup import length_bucketed_batches, sft_warmup, tokenize_pairs


def test_length_bucketing_covers_each_pair_once_per_pass() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(2.0, 1.0, size=100).astype(int) + 1
    batches = length_bucketed_batches(lengths, batch_size=10, num_batches=10, rng=rng)
    assert sorted(np.concatenate(batches).tolist()) == list(range(100))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    random_padded = sum(len(b) * lengths[b].max() for b in np.array_split(rng.permutation(100), 10))
    assert padded < random_padded


def test_sft_trains_on_the_response_and_saves(tiny_model_path: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    for f in tiny_model_path.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    tokenizer = build_char_tokenizer()
    pairs = [("cp:abc=", "abc"), ("up:ab=", "AB"), ("rev:xy=", "yx")]
    batch = tokenize_pairs(tokenizer, pairs)
    assert batch.response_ids[0].tolist()[-1] == tokenizer.eos_token_id  # eos is part of the target
    before = ReferenceModel(model_dir, micro_batch_size=4).compute_log_probs(batch, 1.0)
    stats = sft_warmup(model_dir, tokenizer, pairs, steps=30, lr=3e-3, batch_size=3, seed=0)
    after = ReferenceModel(model_dir, micro_batch_size=4).compute_log_probs(batch, 1.0)
    assert stats["loss_last"] < stats["loss_first"]
    assert sum(a.sum() for a in after) > sum(b.sum() for b in before) + 1.0
