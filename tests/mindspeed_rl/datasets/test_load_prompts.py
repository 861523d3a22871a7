import json
import logging

import pytest

from mindspeed_rl.datasets import PromptRecord, load_prompts
from mindspeed_rl.datasets.templates import apply_template

ROWS = [
    {"problem": "What is 1+1?", "answer": "2"},
    {"problem": "Compute the sum of the first ten positive integers, showing work.", "answer": "55"},
    {"problem": "What is 2*3?", "answer": 6},
    {"problem": None, "answer": "1"},
    {"problem": "What is 9-4?", "answer": None},
    {"problem": "   ", "answer": "0"},
]
MAP_KEYS = {"prompt": "problem", "response": "answer"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_drops_are_counted_by_reason_and_logged(tmp_path, char_tokenizer, caplog):
    data = write_jsonl(tmp_path / "math.jsonl", ROWS)
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl.datasets.loader"):
        prompts = load_prompts(
            data_path=str(data), tokenizer=char_tokenizer, map_keys=MAP_KEYS, max_prompt_length=20
        )
    # Row 1 is 66 characters with the char tokenizer, so over the 20-token limit.
    assert [r.prompt_id for r in prompts.records] == ["math.jsonl:0", "math.jsonl:2"]
    drops = prompts.drops
    assert dict(drops.counts) == {"too_long": 1, "empty_prompt": 2, "missing_label": 1}
    assert drops.examples["empty_prompt"] == ("math.jsonl:3", "math.jsonl:5")
    assert (drops.num_total, drops.num_dropped, drops.num_kept) == (6, 4, 2)
    assert "too_long: 1 (e.g. math.jsonl:1)" in caplog.text


def test_records_hold_template_text_tokens_and_string_labels(tmp_path, char_tokenizer):
    data = write_jsonl(tmp_path / "math.jsonl", ROWS[:3])
    prompts = load_prompts(
        data_path=str(data),
        tokenizer=char_tokenizer,
        prompt_type="qwen_r1",
        map_keys=MAP_KEYS,
        max_prompt_length=4096,
    )
    first, _, third = prompts.records
    assert first.text == apply_template("qwen_r1", "What is 1+1?")
    assert "<think>" in first.text and "\\boxed{}" in first.text
    assert first.token_ids == tuple(char_tokenizer.encode(first.text, add_special_tokens=False))
    assert third.label == "6"  # numeric labels become text for the verifiers
    assert isinstance(first, PromptRecord) and prompts.drops.num_dropped == 0


def test_id_column_query_and_system_columns(tmp_path, char_tokenizer):
    rows = [{"id": "q-7", "instruction": "Add.", "input": "3 and 4", "output": "7", "sys": "Be brief."}]
    data = write_jsonl(tmp_path / "alpaca.jsonl", rows)
    keys = {"prompt": "instruction", "query": "input", "response": "output", "system": "sys"}
    (record,) = load_prompts(
        data_path=str(data), tokenizer=char_tokenizer, map_keys=keys, max_prompt_length=99
    ).records
    assert record.prompt_id == "q-7"
    assert record.text == "Be brief.\nAdd.\n3 and 4"


def test_parquet_and_folder_sources(tmp_path, char_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), folder / "a.parquet")
    write_jsonl(folder / "b.jsonl", ROWS[2:3])
    (folder / "README.md").write_text("not data")
    prompts = load_prompts(
        data_path=str(folder), tokenizer=char_tokenizer, map_keys=MAP_KEYS, max_prompt_length=999
    )
    assert [r.prompt_id for r in prompts.records] == ["a.parquet:0", "a.parquet:1", "b.jsonl:0"]


def test_num_samples_draws_a_seeded_subset_in_source_order(tmp_path, char_tokenizer):
    rows = [{"problem": f"q{i}", "answer": str(i)} for i in range(20)]
    data = str(write_jsonl(tmp_path / "many.jsonl", rows))

    def ids(seed):
        kwargs = dict(tokenizer=char_tokenizer, map_keys=MAP_KEYS, max_prompt_length=50, num_samples=5)
        prompts = load_prompts(data_path=data, seed=seed, **kwargs)
        assert prompts.drops.num_unsampled == 15 and prompts.drops.num_kept == 5
        return [r.prompt_id for r in prompts.records]

    assert ids(0) == ids(0) and ids(0) != ids(1)
    assert ids(0) == sorted(ids(0), key=lambda pid: int(pid.split(":")[1]))
    with pytest.raises(ValueError, match="only 20 prompts remain"):
        load_prompts(
            data_path=data, tokenizer=char_tokenizer, map_keys=MAP_KEYS, max_prompt_length=50, num_samples=21
        )


def test_builtin_maze_source(char_tokenizer):
    prompts = load_prompts(
        data_path="builtin:maze", tokenizer=char_tokenizer, max_prompt_length=4096, num_samples=4
    )
    assert [r.prompt_id for r in prompts.records] == [f"maze-s0-{i}" for i in range(4)]
    assert all(json.loads(r.label)["grid"] for r in prompts.records)
    with pytest.raises(ValueError, match="pass num_samples"):
        load_prompts(data_path="builtin:maze", tokenizer=char_tokenizer, max_prompt_length=4096)
    with pytest.raises(
        ValueError,
        match=r"unknown built-in source 'builtin:mazes'; known: .*builtin:demo_short, builtin:maze",
    ):
        load_prompts(data_path="builtin:mazes", tokenizer=char_tokenizer, max_prompt_length=9, num_samples=1)


def test_builtin_demo_source(char_tokenizer):
    prompts = load_prompts(
        data_path="builtin:demo", tokenizer=char_tokenizer, max_prompt_length=4096, num_samples=8
    )
    assert len(prompts.records) == 8 and all(r.token_ids for r in prompts.records)


def test_upstream_output_prefix_resolves_to_the_written_file(tmp_path, char_tokenizer):
    write_jsonl(tmp_path / "data.jsonl", ROWS[:1])
    prompts = load_prompts(
        data_path=str(tmp_path / "data"), tokenizer=char_tokenizer, map_keys=MAP_KEYS, max_prompt_length=99
    )
    assert len(prompts.records) == 1
