"""cli/profile_lengths.py end to end: tiny model + HF engine -> prompt-length pairs JSONL."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch

from asp_scheduler.jsonl import read_lengths
from cli import profile_lengths
from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_TEST_ARCH, seed=0)


def _write(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_profiles_a_text_prompt_subset(model_dir: Path, tmp_path: Path) -> None:
    rows = [{"prompt_id": f"p{i}", "prompt": "x" * (i + 1) + " ?"} for i in range(6)]
    prompts = _write(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "out" / "lengths.jsonl"
    argv = ["--model", str(model_dir), "--prompts", str(prompts), "--out", str(out), "--backend", "hf"]
    argv += ["--num-prompts", "4", "--n-samples", "3", "--max-tokens", "40", "--batch-size", "3"]
    assert profile_lengths.main(argv) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 4 * 3
    ids = [r["prompt_id"] for r in got]
    assert len(set(ids)) == 4 and set(ids) <= {r["prompt_id"] for r in rows}
    assert [r["sample_idx"] for r in got] == [0, 1, 2] * 4
    by_id = {r["prompt_id"]: r["prompt"] for r in rows}
    for r in got:
        assert r["prompt"] == by_id[r["prompt_id"]]
        assert 1 <= r["response_tokens"] <= 40
        assert r["finish_reason"] in ("stop", "length")
        if r["finish_reason"] == "length":
            assert r["response_tokens"] == 40
    # The scheduler's reader takes the lengths as they are.
    assert read_lengths(out, "response_tokens").tolist() == [float(r["response_tokens"]) for r in got]
    # Same seed -> same subset and same lengths.
    again = tmp_path / "again.jsonl"
    assert profile_lengths.main([*argv[:5], str(again), *argv[6:]]) == 0
    assert again.read_text() == out.read_text()


def test_token_id_prompts_and_input_errors(model_dir: Path, tmp_path: Path) -> None:
    prompts = _write(tmp_path / "ids.jsonl", [{"id": "a", "ids": [2, 70, 71]}, {"id": "b", "ids": [2, 72]}])
    out = tmp_path / "lengths.jsonl"
    base = ["--model", str(model_dir), "--prompts", str(prompts), "--out", str(out), "--backend", "hf"]
    assert (
        profile_lengths.main([*base, "--id-field", "id", "--token-ids-field", "ids", "--max-tokens", "5"])
        == 0
    )
    assert [json.loads(line)["prompt_id"] for line in out.read_text().splitlines()] == ["a", "b"]
    with pytest.raises(ValueError, match="--num-prompts 3"):
        profile_lengths.main([*base, "--id-field", "id", "--token-ids-field", "ids", "--num-prompts", "3"])
    with pytest.raises(ValueError, match="pass --text-field"):
        profile_lengths.main([*base, "--id-field", "id"])
