"""A newcomer's next step: preprocess a DeepMath-style file with the demo's tiny tokenizer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli.preprocess_data import main
from mindspeed_rl.models.tiny import build_char_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"problem": "Find the residue of \\( \\frac{31!}{22!} \\) modulo 11.", "answer": "1"},
    {
        "problem": "Show that \\(x \\in \\mathbb{R}_{>0}\\) and \u03b1 \u2264 \u03b2 \u2014 the caf\u00e9 case.",
        "answer": "x",
    },
    {"problem": "What is 2*3?", "answer": "6"},
]


def write_data(tmp_path: Path) -> Path:
    data = tmp_path / "deepmath.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    return data


def old_tiny_tokenizer(path: Path) -> Path:
    """The tiny tokenizer as models built before the unknown token were saved: no <unk>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["<pad>", "<|endoftext|>", "\n", "\t", *(chr(c) for c in range(32, 127))]
    backend = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|endoftext|>"
    ).save_pretrained(path)
    return path


def test_latex_and_non_ascii_preprocess_with_the_tiny_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    build_char_tokenizer().save_pretrained(tmp_path / "tok")
    data = write_data(tmp_path)
    args = [
        "deepscaler",
        f"input={data}",
        f"tokenizer_name_or_path={tmp_path / 'tok'}",
        f"output_prefix={tmp_path / 'out'}",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert f"wrote 3 prompts to {tmp_path / 'out'}.jsonl" in captured.out
    # Kept, and said so: which characters became <unk>.
    warned = caplog.text
    assert "1 of 3 prompts" in warned and "'\u2264' (U+2264)" in warned and "kept" in warned
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert "\\frac{31!}{22!}" in rows[0]["text"]


def test_a_tokenizer_without_unknown_token_fails_in_one_line_naming_file_line_and_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = old_tiny_tokenizer(tmp_path / "old_tok")
    data = write_data(tmp_path)
    assert (
        main(
            [
                "deepscaler",
                f"input={data}",
                f"tokenizer_name_or_path={tok}",
                f"output_prefix={tmp_path / 'o'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: {data} line 2: the tokenizer cannot encode character '\u03b1' (U+03B1)")
    assert "delete the folder so it is rebuilt" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_missing_tokenizer_folder_is_one_line_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path)
    args = [
        "deepscaler",
        f"input={data}",
        f"tokenizer_name_or_path={tmp_path / 'nope'}",
        f"output_prefix={tmp_path / 'o'}",
    ]
    assert main(args) == 2
    assert "is not a tokenizer folder" in capsys.readouterr().err


@pytest.mark.slow
def test_the_shell_wrapper_runs_the_command_from_the_issue(tmp_path: Path) -> None:
    build_char_tokenizer().save_pretrained(tmp_path / "tiny_qwen3")
    data = write_data(tmp_path)
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "examples/data/preprocess_data.sh"), "deepscaler", f"input={data}",
         f"tokenizer_name_or_path={tmp_path / 'tiny_qwen3'}", f"output_prefix={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out.jsonl").is_file() and "Traceback" not in proc.stderr
