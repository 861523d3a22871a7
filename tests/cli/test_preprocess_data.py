import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.preprocess_data import CONFIG_DIR, load_config, main
from mindspeed_rl.datasets import load_prompts

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"problem": "What is 1+1?", "answer": "2"},
    {"problem": "A long question: " + "x" * 300, "answer": "3"},  # over the length limit
    {"problem": "What is 2*3?", "answer": "6"},
    {"problem": None, "answer": "4"},
]


def build_char_tokenizer():
    """Character-level HF tokenizer built in memory (no hub downloads)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["<unk>", "\n", "\t", *(chr(c) for c in range(32, 127))]
    backend = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    build_char_tokenizer().save_pretrained(path)
    return path


def write_config(tmp_path, tokenizer_dir, **overrides):
    data = tmp_path / "raw.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    config = {
        "input": str(data),
        "tokenizer_name_or_path": str(tokenizer_dir),
        "output_prefix": str(tmp_path / "out" / "data"),
        "prompt_type": "qwen_r1",
        "map_keys": {"prompt": "problem", "query": "", "response": "answer", "system": ""},
        "dataset_additional_keys": ["labels"],
        "max_prompt_length": 300,
        **overrides,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(config))  # JSON is valid YAML
    return path


@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])
def test_preprocess_writes_a_file_load_prompts_reads_back(tmp_path, tokenizer_dir, capsys, output_format):
    config = write_config(tmp_path, tokenizer_dir, output_format=output_format)
    assert main([str(config)]) == 0
    out = capsys.readouterr().out
    assert f"wrote 2 prompts to {tmp_path / 'out' / 'data'}.{output_format}" in out
    assert (
        "kept 2 of 4 prompts" in out and "too_long: 1 (e.g. raw.jsonl:1)" in out and "empty_prompt: 1" in out
    )

    tokenizer = build_char_tokenizer()
    reloaded = load_prompts(
        data_path=str(tmp_path / "out" / "data"),
        tokenizer=tokenizer,
        prompt_type="qwen_r1",
        max_prompt_length=300,
    )
    direct = load_prompts(
        data_path=str(tmp_path / "raw.jsonl"),
        tokenizer=tokenizer,
        prompt_type="qwen_r1",
        map_keys={"prompt": "problem", "response": "answer"},
        max_prompt_length=300,
    )
    assert reloaded.records == direct.records
    assert [r.label for r in reloaded.records] == ["2", "6"]


def test_preprocessed_file_refuses_another_template_or_tokenizer(tmp_path, tokenizer_dir):
    assert main([str(write_config(tmp_path, tokenizer_dir))]) == 0
    prefix = str(tmp_path / "out" / "data")
    tokenizer = build_char_tokenizer()
    with pytest.raises(ValueError, match="preprocessed with prompt_type 'qwen_r1'"):
        load_prompts(data_path=prefix, tokenizer=tokenizer, prompt_type="empty", max_prompt_length=300)

    class ShiftedTokenizer:
        def encode(self, text, *, add_special_tokens):
            return [i + 1 for i in tokenizer.encode(text, add_special_tokens=add_special_tokens)]

    with pytest.raises(ValueError, match="preprocessed with another tokenizer"):
        load_prompts(
            data_path=prefix, tokenizer=ShiftedTokenizer(), prompt_type="qwen_r1", max_prompt_length=300
        )
    # A tighter limit at load time still filters, and counts, preprocessed prompts.
    tight = load_prompts(data_path=prefix, tokenizer=tokenizer, prompt_type="qwen_r1", max_prompt_length=60)
    assert len(tight.records) + tight.drops.counts["too_long"] == 2


def test_unknown_key_names_the_nearest_valid_key(tmp_path, tokenizer_dir, capsys):
    config = write_config(tmp_path, tokenizer_dir, max_prompt_lenght=10)
    assert main([str(config)]) == 2
    assert "did you mean 'max_prompt_length'" in capsys.readouterr().err


def test_overrides_and_all_dropped_is_an_error(tmp_path, tokenizer_dir, capsys):
    config = write_config(tmp_path, tokenizer_dir)
    assert main([str(config), "max_prompt_length=5"]) == 2
    assert "every prompt from" in capsys.readouterr().err


def test_unsupported_additional_keys_and_tokenizer_type(tmp_path, tokenizer_dir, capsys):
    assert main([str(write_config(tmp_path, tokenizer_dir, dataset_additional_keys=["labels", "ids"]))]) == 2
    assert "dataset_additional_keys ['ids']" in capsys.readouterr().err
    assert main([str(write_config(tmp_path, tokenizer_dir, tokenizer_type="Llama"))]) == 2
    assert "use PretrainedFromHF" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_shipped_dataset_configs_load(name):
    config = load_config(name, [])
    assert config.output_prefix and config.prompt_type in {"empty", "qwen_r1", "qwen3"}


def test_shipped_configs_exist():
    assert {"deepscaler", "math_17k"} <= {p.stem for p in CONFIG_DIR.glob("*.yaml")}


@pytest.mark.slow  # a fresh interpreter imports transformers: ~5-15 s on 2 shared cores
def test_example_script_runs_the_cli(tmp_path, tokenizer_dir):
    config = write_config(tmp_path, tokenizer_dir, input="builtin:maze", map_keys=None, num_samples=3)
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "examples/data/preprocess_data.sh"), str(config), "max_prompt_length=4096"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 prompts" in done.stdout
    assert len((tmp_path / "out" / "data.jsonl").read_text().splitlines()) == 3
