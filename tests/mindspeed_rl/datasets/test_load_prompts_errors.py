import json

import pytest

from mindspeed_rl.datasets import load_prompts

MAP_KEYS = {"prompt": "problem", "response": "answer"}


def load(path, tokenizer, **kwargs):
    kwargs.setdefault("map_keys", MAP_KEYS)
    return load_prompts(data_path=str(path), tokenizer=tokenizer, max_prompt_length=100, **kwargs)


def test_missing_column_names_file_line_column_and_fix(tmp_path, char_tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n')
    with pytest.raises(
        ValueError, match=r"d\.jsonl line 2: column 'problem' \(map_keys\.prompt\) not found.*question"
    ):
        load(path, char_tokenizer)


def test_non_utf8_line_is_reported_with_its_line_number(tmp_path, char_tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"problem": "a", "answer": "1"}\n{"problem": "\xff\xfe", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl line 2 is not valid UTF-8.*re-encode"):
        load(path, char_tokenizer)


def test_invalid_json_and_non_object_lines(tmp_path, char_tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON"):
        load(path, char_tokenizer)
    path.write_text('["a", "1"]\n')
    with pytest.raises(ValueError, match=r"line 1 is a list, expected a JSON object"):
        load(path, char_tokenizer)


def test_empty_file_and_empty_folder(tmp_path, char_tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no rows"):
        load(empty, char_tokenizer)
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(ValueError, match="holds no .jsonl or .parquet files"):
        load(folder, char_tokenizer)


def test_missing_path_lists_what_was_tried(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match=r"does not exist \(also tried .*nope\.jsonl"):
        load(tmp_path / "nope", char_tokenizer)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_type": "qwen_r"}, "did you mean 'qwen_r1'"),
        ({"map_keys": {"promt": "problem"}}, "did you mean 'prompt'"),
        ({"map_keys": {"prompt": ""}}, "map_keys.prompt is empty"),
        ({"num_samples": 0}, "num_samples must be >= 1"),
    ],
)
def test_bad_arguments(tmp_path, char_tokenizer, kwargs, match):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n')
    with pytest.raises(ValueError, match=match):
        load(path, char_tokenizer, **kwargs)


def test_non_text_prompt_column_and_duplicate_ids(tmp_path, char_tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": [{"role": "user"}], "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match="holds a list, expected text"):
        load(path, char_tokenizer)
    path.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"not unique: \['1'\]"):
        load(path, char_tokenizer)
