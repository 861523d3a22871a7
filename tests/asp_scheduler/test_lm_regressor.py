from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asp_scheduler.predictors.base import LengthPredictor, PromptItem
from asp_scheduler.predictors.lm_regressor import LMRegressor, LMRegressorConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

_FILLER = [f"w{i}" for i in range(20)]
_KEYWORDS = {"brief": 1.0, "normal": 3.0, "detailed": 9.0}
_SPECIALS = ["<pad>", "<unk>", "<eos>"]


def build_tiny_model(out: Path) -> Path:
    """A randomly initialised 2-layer Qwen3 and a word-level tokenizer, both built locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {tok: i for i, tok in enumerate([*_SPECIALS, *_FILLER, *_KEYWORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(out)
    config = Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Matrices this small run ~20x slower with several threads on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"))
    torch.set_num_threads(threads)


def _synthetic(num_prompts: int, samples: int, seed: int) -> tuple[list[PromptItem], np.ndarray]:
    """Length is set by one keyword hidden at a random position among filler words."""
    rng = np.random.default_rng(seed)
    prompts, lengths = [], []
    for i in range(num_prompts):
        keyword = str(rng.choice(list(_KEYWORDS)))
        words = list(rng.choice(_FILLER, size=int(rng.integers(3, 8))))
        words.insert(int(rng.integers(0, len(words) + 1)), keyword)
        for _ in range(samples):
            prompts.append(PromptItem(prompt_id=f"p{i}", text=" ".join(words)))
            lengths.append(100.0 * _KEYWORDS[keyword] * float(np.exp(rng.normal(0.0, 0.15))))
    return prompts, np.asarray(lengths)


_CONFIG = LMRegressorConfig(epochs=8, lr=3e-3, batch_size=16, max_prompt_tokens=32, seed=0)


def test_learns_keyword_relation_and_save_load_round_trips(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompts, lengths = _synthetic(120, 2, seed=0)
    predictor = LMRegressor(tiny_model_dir, _CONFIG)
    quality = predictor.fit_report(prompts, lengths, holdout_fraction=0.25, seed=0)
    # Standardised targets start near loss 1; learning the keyword brings it far below.
    assert predictor.train_losses[-1] < 0.3 * predictor.train_losses[0]
    assert quality.kendall_tau > 0.5
    assert quality.num_pairs == 30 * 2

    test_prompts, _ = _synthetic(20, 1, seed=1)
    before = predictor.predict(test_prompts)
    assert before.dtype == np.float64 and np.all(before > 0)
    LMRegressor.load(predictor.save(tmp_path / "saved"))
    after = LMRegressor.load(tmp_path / "saved").predict(test_prompts)
    np.testing.assert_array_equal(before, after)


def test_fit_is_deterministic_for_a_seed(tiny_model_dir: Path) -> None:
    prompts, lengths = _synthetic(24, 1, seed=2)
    cfg = LMRegressorConfig(epochs=2, lr=3e-3, batch_size=8, max_prompt_tokens=32, seed=3)
    as_protocol: LengthPredictor = LMRegressor(tiny_model_dir, cfg)  # mypy checks the Protocol here
    assert as_protocol.name == "lm_regressor"
    first = LMRegressor(tiny_model_dir, cfg).fit(prompts, lengths)
    second = LMRegressor(tiny_model_dir, cfg).fit(prompts, lengths)
    assert first.train_losses == second.train_losses
    np.testing.assert_array_equal(first.predict(prompts), second.predict(prompts))


def test_user_errors_are_reported(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        LMRegressor(tmp_path)
    with pytest.raises(ValueError, match="before fit"):
        LMRegressor(tiny_model_dir).predict([PromptItem("a", "w1")])
    with pytest.raises(ValueError, match="before fit"):
        LMRegressor(tiny_model_dir).save(tmp_path / "x")
    with pytest.raises(ValueError, match="length_regressor.json"):
        LMRegressor.load(tiny_model_dir)
    with pytest.raises(ValueError, match="epochs"):
        LMRegressorConfig(epochs=0)


def test_importing_the_module_does_not_import_torch() -> None:
    root = Path(__file__).resolve().parents[2]
    code = "import sys, asp_scheduler.predictors.lm_regressor; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
