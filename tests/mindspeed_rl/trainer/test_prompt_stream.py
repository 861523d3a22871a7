"""A streaming run over files reads its prompts lazily: the same draws, in the same order, as the
loaded split would give, tokenized only as the window draws them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.datasets.split import PromptSplits
from mindspeed_rl.models.tiny import build_char_tokenizer
from mindspeed_rl.runtime.records import ScheduledMinibatch
from mindspeed_rl.trainer import async_inputs, prompts
from mindspeed_rl.trainer.checkpointing import ResumePoint
from mindspeed_rl.trainer.startup import RunStart
from tests.support.plans import small_async_plan

LAZY = (
    "warmup_config.enabled=false",
    "megatron_training.eval_interval=null",
    "megatron_training.no_shuffle=true",
    "megatron_training.split='100,0,0'",
    "++asp_config.window=1",
)


class CountingTokenizer:
    """The char tokenizer, counting how many texts it was asked to encode."""

    def __init__(self) -> None:
        self.inner, self.calls = build_char_tokenizer(), 0

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.calls += 1
        return self.inner.encode(text, **kwargs)


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]


def _data(path: str, *overrides: str):
    return small_async_plan(f"megatron_training.data_path={path}", *LAZY, *overrides).data


def _key(records) -> list[tuple[str, tuple[int, ...], str]]:
    return [(r.prompt_id, tuple(r.token_ids), r.label) for r in records]


def test_the_stream_draws_what_the_loaded_split_draws(tmp_path: Path) -> None:
    rows = _rows(7)
    rows[3]["prompt"] = "   "  # dropped in every pass, as the loader drops it
    data = _data(_write(tmp_path / "d.jsonl", rows), "megatron_training.train_iters=5")
    tokenizer = build_char_tokenizer()
    loaded = async_inputs.run_prompts(data, prompts.load_prompt_splits(data, tokenizer).train)
    streamed = list(prompts.stream_run_prompts(data, tokenizer))
    assert len(streamed) == 5 * 4 and _key(streamed) == _key(loaded)
    assert "q0@3" in {r.prompt_id for r in streamed}  # 20 draws over 6 prompts: a fourth pass


def test_the_stream_tokenizes_only_what_is_drawn(tmp_path: Path) -> None:
    data = _data(_write(tmp_path / "big.jsonl", _rows(2000)), "megatron_training.train_iters=400")
    tokenizer = CountingTokenizer()
    stream = prompts.stream_run_prompts(data, tokenizer)
    assert tokenizer.calls == 0, "nothing is read before the first draw"
    first = list(itertools.islice(stream, 3))
    assert [r.prompt_id for r in first] == ["q0", "q1", "q2"] and tokenizer.calls == 3


def test_a_repeated_id_fails_the_draw_that_meets_it(tmp_path: Path) -> None:
    rows = _rows(6)
    rows[4]["id"] = "q1"
    stream = prompts.stream_run_prompts(_data(_write(tmp_path / "d.jsonl", rows)), build_char_tokenizer())
    assert [r.prompt_id for r in itertools.islice(stream, 4)] == ["q0", "q1", "q2", "q3"]
    with pytest.raises(ValueError, match="'q1' appears twice.*map_keys.id"):
        next(stream)


def test_fewer_prompts_than_a_global_batch_is_a_clear_error(tmp_path: Path) -> None:
    stream = prompts.stream_run_prompts(_data(_write(tmp_path / "d.jsonl", _rows(3))), build_char_tokenizer())
    with pytest.raises(ValueError, match="only 3 prompts.*global_batch_size is 4"):
        list(stream)


def test_a_held_out_prompt_in_the_training_file_is_refused(tmp_path: Path) -> None:
    data = _data(_write(tmp_path / "d.jsonl", _rows(8)))
    stream = prompts.stream_run_prompts(data, build_char_tokenizer(), held_out=frozenset({"q2"}))
    with pytest.raises(ValueError, match="'q2'.*valid_data_path"):
        list(stream)


def test_only_an_unshuffled_window_over_files_with_nothing_held_out_streams(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", _rows(8))
    assert prompts.streams_from_files(_data(path), window=1)
    assert not prompts.streams_from_files(_data(path), window=None)
    assert not prompts.streams_from_files(_data(path, "megatron_training.no_shuffle=false"), window=1)
    assert not prompts.streams_from_files(_data(path, "megatron_training.split='90,10,0'"), window=1)
    assert not prompts.streams_from_files(_data("builtin:demo"), window=1)


def _streaming_run(tmp_path: Path, resumed: ResumePoint | None = None) -> RunStart:
    path = _write(tmp_path / "d.jsonl", _rows(40))
    lengths = _write(
        tmp_path / "lengths.jsonl", [{"prompt_id": f"q{i}", "length": 1 + i % 7} for i in range(40)]
    )
    plan = small_async_plan(
        f"megatron_training.data_path={path}", *LAZY, "megatron_training.train_iters=6", "asp_config.b=2",
        "asp_config.kappa=0", "asp_config.k=2", "asp_config.sa_iterations=100",
        "++asp_config.predictor.calibrate_nu=false", f"++asp_config.predictor.path={lengths}",
    )  # fmt: skip
    tokenizer_dir = tmp_path / "tok"
    if not tokenizer_dir.is_dir():
        build_char_tokenizer().save_pretrained(str(tokenizer_dir))
    run_dir = tmp_path / ("resumed" if resumed else "fresh")
    run_dir.mkdir(exist_ok=True)
    return RunStart(
        plan=plan, run_dir=run_dir, resumed=resumed, placement=None,  # type: ignore[arg-type]
        policy_path=str(tokenizer_dir), splits=PromptSplits(train=(), valid=(), test=()),
    )  # fmt: skip


def _chunks(built: async_inputs.PipelineInputs, steps: range) -> list[ScheduledMinibatch]:
    assert built.window is not None
    out: list[ScheduledMinibatch] = []
    for step in steps:
        if (chunk := built.window.top_up(step)) is not None:
            assert sorted(p for mb in chunk.minibatches for p in mb.prompt_ids) == sorted(
                r.prompt_id for r in chunk.records
            )
            out += chunk.minibatches
    return out


def _ids(minibatches) -> list[str]:
    return [p for mb in minibatches for p in mb.prompt_ids]


def test_a_streaming_run_reads_its_file_only_as_its_window_drains(tmp_path: Path) -> None:
    built = async_inputs.run_inputs(_streaming_run(tmp_path), None)
    assert built.window is not None and not isinstance(built.stream, tuple)
    assert len(built.prompts) == 4, "the first window is one global batch, not the file"
    drawn = _ids(built.schedule) + _ids(_chunks(built, range(6)))
    # ASP orders inside each chunk; the chunks follow the file.
    assert sorted(drawn) == sorted(f"q{i}" for i in range(24)) and built.window.closed
    assert sorted(drawn[:4]) == [f"q{i}" for i in range(4)]


def test_a_resumed_streaming_run_skips_what_its_lineage_drew_and_draws_the_rest(tmp_path: Path) -> None:
    fresh = async_inputs.run_inputs(_streaming_run(tmp_path), None)
    lineage = (*fresh.schedule, *_chunks(fresh, range(2)))  # two global batches drawn
    assert sorted(_ids(lineage)) == sorted(f"q{i}" for i in range(8))
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    consumed = tuple(_ids(fresh.schedule))  # the first step's batch was trained
    point = ResumePoint(folder=folder, iteration=1, prompts_consumed=consumed, schedule=lineage)
    resumed = async_inputs.run_inputs(_streaming_run(tmp_path, point), None)
    assert resumed.schedule == point.remaining_schedule and resumed.window is not None
    assert sorted(r.prompt_id for r in resumed.prompts) == sorted(set(_ids(lineage)) - set(consumed))
    rest = _ids(_chunks(resumed, range(2, 6)))
    assert sorted(rest) == sorted(f"q{i}" for i in range(8, 24)) and resumed.window.closed
