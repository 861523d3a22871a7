"""The transformers adapter (``models.transformers_compat``) against the installed release's real
classes, whichever major it is: 5.19 in .venv, 4.57.1 (the Ascend trainer set's line) under
``make test-trainer-stack``, which runs this file with that release first on the path."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mindspeed_rl.models import transformers_compat as compat
from mindspeed_rl.models.tiny import config_from_arch

ARCH = {
    "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
    "num_query_groups": 2, "kv_channels": 16, "max_position_embeddings": 256, "padded_vocab_size": 128,
    "rotary_base": 500000.0,
}  # fmt: skip


def _model(tied: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    arch = {**ARCH, "untie_embeddings_and_output_weights": not tied}
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config_from_arch(arch), dtype=torch.float32)


def test_the_installed_qwen3_config_has_the_recorded_rope_parameters() -> None:
    from transformers import Qwen3Config

    params = inspect.signature(Qwen3Config.__init__).parameters
    recorded = compat.RECORDED_QWEN3_ROPE_PARAMETERS[compat.major_version()]
    assert all(p in params for p in recorded), (recorded, list(params))
    other = compat.RECORDED_QWEN3_ROPE_PARAMETERS[9 - compat.major_version()]
    assert not any(p in params for p in other), "the other major's RoPE keywords exist too: re-read"


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tied_targets_are_the_names_save_pretrained_leaves_out(tmp_path: Path, tied: bool) -> None:
    model = _model(tied)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    targets = compat.tied_targets(model)
    assert set(model.state_dict()) - saved == set(targets)
    assert all(source in saved for source in targets.values())
    assert bool(targets) == tied


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_4x_rule_agrees_with_the_installed_release(tied: bool) -> None:
    # Under 5.x this checks the 4.x rule (class patterns over shared storage) against 5.x's own
    # table; under 4.x it is the rule itself.
    model = _model(tied)
    assert compat._tied_by_storage(model) == compat.tied_targets(model)


def _write_config(folder: Path, **rope: object) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, **rope,
    }))  # fmt: skip
    return folder


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}},  # written by 5.x
        {"rope_theta": 250000.0},  # written by 4.x (and every Qwen release on the hub)
        {"rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}, "rope_theta": 250000.0},
    ],
    ids=["5x", "4x", "portable"],
)
def test_load_config_keeps_the_rope_base_whoever_wrote_it(tmp_path: Path, rope: dict[str, object]) -> None:
    folder = _write_config(tmp_path / "m", **rope)
    assert compat.rope_base(compat.load_config(folder)) == 250000.0


def test_a_written_config_is_read_alike_by_both_majors(tmp_path: Path) -> None:
    config = config_from_arch(ARCH)
    config.save_pretrained(tmp_path)
    compat.write_portable_config(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    # Both spellings, so that 4.x (rope_theta) and 5.x (rope_parameters) read one base.
    assert data["rope_theta"] == 500000.0
    if "rope_parameters" in data:
        assert data["rope_parameters"]["rope_theta"] == 500000.0
    from transformers import AutoConfig

    assert compat.rope_base(AutoConfig.from_pretrained(tmp_path)) == 500000.0
    before = (tmp_path / "config.json").read_text()
    compat.write_portable_config(tmp_path)  # idempotent
    assert (tmp_path / "config.json").read_text() == before


def test_the_trainer_loads_a_5x_written_model_with_its_rope_base(tmp_path: Path) -> None:
    # A folder whose config.json has only the 5.x spelling (written by a 5.x environment without
    # the portable fix): the trainer's loader must still rotate with the model's base.
    from mindspeed_rl.models.training.reference import load_causal_lm

    model = _model(tied=False)
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("rope_theta", None)
    data["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(data))
    loaded = load_causal_lm(tmp_path, "cpu")
    assert compat.rope_base(loaded.config) == 500000.0
    inv_freq = loaded.model.rotary_emb.inv_freq
    head_dim = ARCH["kv_channels"]
    expected = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    torch.testing.assert_close(inv_freq.float(), expected)


def _as_saved_by_5x(folder: Path) -> None:
    """The tokenizer_config.json fields transformers 5.19.0 writes for this fast tokenizer
    (recorded from its save_pretrained), whichever major saved the folder."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    specials = config.pop("additional_special_tokens", None) or ["<|im_start|>", "<|im_end|>"]
    extra = config.get("extra_special_tokens")
    config.update(
        tokenizer_class="TokenizersBackend",
        backend="tokenizers",
        extra_special_tokens=extra if isinstance(extra, list) else specials,
    )
    path.write_text(json.dumps(config))


def _encodings(tokenizer: object) -> tuple[object, ...]:
    chat = [{"role": "user", "content": "ab="}]
    return (
        tokenizer.encode("ab=<|im_start|>c"),  # type: ignore[attr-defined]
        tokenizer.decode([1, 2, 3]),  # type: ignore[attr-defined]
        tokenizer.eos_token, tokenizer.pad_token, sorted(tokenizer.all_special_tokens),  # type: ignore[attr-defined]
        tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),  # type: ignore[attr-defined]
    )  # fmt: skip


def test_a_tokenizer_saved_by_5x_loads_alike_and_the_portable_spelling_too(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from mindspeed_rl.models.tiny import build_char_tokenizer

    original = build_char_tokenizer()
    expected = _encodings(original)
    saved = tmp_path / "saved"
    original.save_pretrained(saved)
    _as_saved_by_5x(saved)
    assert _encodings(compat.load_tokenizer(saved)) == expected
    compat.write_portable_tokenizer(saved)
    config = json.loads((saved / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "extra_special_tokens" not in config
    assert _encodings(AutoTokenizer.from_pretrained(saved, local_files_only=True)) == expected


@pytest.mark.parametrize(
    "arch_name", ["TINY_TEST_ARCH", "TINY_QWEN3_TIED_ARCH", "TINY_QWEN25_ARCH", "TINY_QWEN3_MOE_ARCH"]
)
@pytest.mark.parametrize("spelling", ["as saved", "as 5.x saves it"])
def test_a_folder_built_here_loads_the_tokenizer_autotokenizer_would(
    tmp_path: Path, spelling: str, arch_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tiny family, as ``models/tiny.py`` writes it: with the build record beside it, the
    folder's tokenizer is the class and the encodings AutoTokenizer gives, and AutoTokenizer is
    skipped exactly for the families it leaves generic. Without the record, AutoTokenizer decides."""
    from transformers import AutoTokenizer

    from mindspeed_rl.models import tiny
    from mindspeed_rl.models.training.hf_folder import BUILD_RECORD

    folder = tiny.create_tiny_model(tmp_path / "model", getattr(tiny, arch_name))
    if spelling != "as saved":
        _as_saved_by_5x(folder)
    by_auto = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert not compat._built_here_with_a_generic_fast_tokenizer(folder)
    (folder / BUILD_RECORD).write_text("{}")
    skips = compat._built_here_with_a_generic_fast_tokenizer(folder)
    generic = type(by_auto).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert skips == (compat.major_version() >= 5 and generic)
    calls: list[object] = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or real(*a, **k))
    loaded = compat.load_tokenizer(folder)
    assert type(loaded) is type(by_auto) and _encodings(loaded) == _encodings(by_auto)
    assert (calls == []) == skips or compat.major_version() < 5  # 4.x: the older test's path above
