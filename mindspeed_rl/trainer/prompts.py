"""The run's prompts: the configured data split into train / valid / test, and the global batches
of prompt ids both pipelines draw from the train part.

Reads only the plan's ``DataSpec``. ``load_run_split`` is the one place a run loads its prompts
and writes ``split_ids.json``; both pipelines draw their batches with ``global_batches``, so they
train on the same prompts in the same order.

A streaming run (``asp_config.window``) over files, in source order and with nothing held out
(``no_shuffle: true``, ``split: 100,0,0``), never loads its training prompts:
``stream_run_prompts`` reads and tokenizes them only as the window draws, in the very order
``global_batches`` would give. Any other streaming run loads the split and streams from memory
(a shuffle or a held-out part needs every prompt up front).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.models.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from mindspeed_rl.datasets import PromptRecord, PromptSet
    from mindspeed_rl.datasets.split import PromptSplits
    from mindspeed_rl.plan.build import DataSpec

SPLIT_IDS_FILE = "split_ids.json"


def load_run_split(
    data: DataSpec, policy_path: str, run_dir: Path, *, streamed: bool = False
) -> PromptSplits:
    """The run's split, tokenized with the policy's tokenizer; its ids go to ``split_ids.json``.
    ``streamed`` (``streams_from_files``): only the held-out file is loaded; ``train`` is empty and
    ``split_ids.json`` names the source instead of listing its ids."""
    import json

    from mindspeed_rl.datasets.split import PromptSplits, write_split_ids

    tokenizer = load_tokenizer(policy_path)
    if not streamed:
        splits = load_prompt_splits(data, tokenizer)
        write_split_ids(run_dir / SPLIT_IDS_FILE, splits)
        return splits
    valid = _load_valid_path(data, tokenizer, data.valid_data_path) if data.valid_data_path else ()
    splits = PromptSplits(train=(), valid=valid, test=())
    ids = {
        "train": None,
        "train_streamed_from": data.data_path,
        "valid": [r.prompt_id for r in valid],
        "test": [],
    }
    (run_dir / SPLIT_IDS_FILE).write_text(json.dumps(ids) + "\n", encoding="utf-8")
    return splits


def streams_from_files(data: DataSpec, window: int | None) -> bool:
    """Whether a run reads its training prompts lazily (module docstring): a streaming window over
    files, unshuffled, with nothing held out of ``data_path``."""
    from mindspeed_rl.datasets.split import parse_split

    weights = parse_split(data.split)
    return (
        window is not None
        and not data.shuffle
        and weights.valid == 0
        and weights.test == 0
        and not data.data_path.startswith("builtin:")
    )


def stream_run_prompts(
    data: DataSpec, tokenizer: Any, *, held_out: frozenset[str] = frozenset()
) -> Iterator[PromptRecord]:
    """The run's ``train_iters x global_batch_size`` prompts, read from ``data_path`` pass after
    pass as they are drawn; a later pass renames its draws ``<id>@<pass>`` (``run_prompts``).
    Unshuffled, ``global_batches``' order is the files' order repeated, so this is the same
    sequence a loaded split gives, without holding it. A prompt id of ``held_out`` (the
    ``valid_data_path`` set) fails the draw that meets it, as the loaded split refuses it."""
    from mindspeed_rl.datasets.loader import stream_prompts
    from mindspeed_rl.datasets.prompt_alias import pass_alias

    size, remaining, draw = (
        data.num_prompts_per_global_batch,
        data.num_prompts_per_global_batch * data.generation_batches,
        0,
    )
    while remaining > 0:
        in_pass = 0
        for record in stream_prompts(
            data_path=data.data_path,
            tokenizer=tokenizer,
            prompt_type=data.prompt_type,
            map_keys=data.map_keys,
            max_prompt_length=data.max_prompt_length,
        ):
            if record.prompt_id in held_out:
                raise ValueError(
                    f"prompt {record.prompt_id!r} of {data.data_path} is also in valid_data_path; "
                    "evaluation prompts must be held out from training: use a disjoint file"
                )
            yield dataclasses.replace(record, prompt_id=pass_alias(record.prompt_id, draw))
            in_pass, remaining = in_pass + 1, remaining - 1
            if remaining == 0:
                return
        if in_pass < size:
            raise ValueError(
                f"only {in_pass} prompts of {data.data_path} survived loading but global_batch_size is "
                f"{size}; add data, raise max_prompt_length, or lower megatron_training.global_batch_size"
            )
        draw += 1


def load_prompt_set(data: DataSpec, tokenizer: Any) -> PromptSet:
    """The TRAIN prompts of the run (``split``'s held-out parts removed), drops counted and logged."""
    from mindspeed_rl.datasets import PromptSet
    from mindspeed_rl.datasets.split import split_prompts

    loaded = _load_data_path(data, tokenizer)
    train = split_prompts(loaded.records, data.split, data.seed).train
    return PromptSet(records=list(train), drops=loaded.drops)


def load_prompt_splits(data: DataSpec, tokenizer: Any) -> PromptSplits:
    """Train / valid / test prompts: ``split`` applied to ``data_path``, or, when
    ``valid_data_path`` is set, that file as the valid part (``split``'s valid weight must be 0:
    two eval sets at once would be ambiguous). Training must only ever see ``.train``."""
    from mindspeed_rl.datasets.split import parse_split, split_prompts

    valid_path = data.valid_data_path
    if valid_path and parse_split(data.split).valid > 0:
        raise ValueError(
            f"megatron_training.valid_data_path={valid_path!r} and split={data.split!r} both "
            "define an eval set; set split's valid weight to 0 (e.g. '100,0,0') or remove valid_data_path"
        )
    splits = split_prompts(_load_data_path(data, tokenizer).records, data.split, data.seed)
    if not valid_path:
        return splits
    valid = _load_valid_path(data, tokenizer, valid_path)
    shared = {r.prompt_id for r in splits.train} & {r.prompt_id for r in valid}
    if shared:
        raise ValueError(
            f"valid_data_path shares {len(shared)} prompt ids with data_path (e.g. {sorted(shared)[:3]}); "
            "evaluation prompts must be held out from training: use a disjoint file or split"
        )
    return dataclasses.replace(splits, valid=valid)


def _load_data_path(data: DataSpec, tokenizer: Any) -> PromptSet:
    from mindspeed_rl.datasets import load_prompts
    from mindspeed_rl.datasets.split import parse_split, prompts_to_generate

    builtin = data.data_path.startswith("builtin:")
    # Built-in tasks are generated: enough distinct prompts that the train part of the split
    # covers every iteration of the run.
    num_train = data.num_prompts_per_global_batch * max(1, data.generation_batches)
    return load_prompts(
        data_path=data.data_path,
        tokenizer=tokenizer,
        prompt_type=data.prompt_type,
        map_keys=None if builtin else data.map_keys,
        max_prompt_length=data.max_prompt_length,
        num_samples=prompts_to_generate(num_train, parse_split(data.split)) if builtin else None,
        seed=data.seed,
    )


def _load_valid_path(data: DataSpec, tokenizer: Any, valid_path: str) -> tuple[PromptRecord, ...]:
    from mindspeed_rl.datasets import load_prompts

    if valid_path.startswith("builtin:"):
        raise ValueError(
            f"megatron_training.valid_data_path={valid_path!r}: built-in tasks are generated from the "
            "run seed, so they would repeat the training prompts; hold prompts out with split instead, "
            "e.g. split: '90,10,0'"
        )
    loaded = load_prompts(
        data_path=valid_path,
        tokenizer=tokenizer,
        prompt_type=data.prompt_type,
        map_keys=data.map_keys,
        max_prompt_length=data.max_prompt_length,
        seed=data.seed,
    )
    return tuple(loaded.records)


def global_batches(data: DataSpec, prompt_ids: list[str]) -> list[tuple[str, ...]]:
    """The run's generation batches of prompt ids (``DataSpec.generation_batches``: one per
    iteration, unless DAPO trains iterations of another size); reshuffled at every pass.

    Upstream semantics: ``global_batch_size`` prompts per generation batch, seeded shuffling unless
    ``no_shuffle``. Leftover prompts at the end of a pass roll into the next batch instead of being
    dropped.
    """
    import numpy as np

    size = data.num_prompts_per_global_batch
    if len(prompt_ids) < size:
        raise ValueError(
            f"only {len(prompt_ids)} prompts survived loading but global_batch_size is {size}; "
            "add data, raise max_prompt_length, or lower megatron_training.global_batch_size"
        )
    rng = np.random.default_rng(data.seed)
    stream: list[str] = []
    batches: list[tuple[str, ...]] = []
    while len(batches) < data.generation_batches:
        if len(stream) < size:
            indices = rng.permutation(len(prompt_ids)) if data.shuffle else np.arange(len(prompt_ids))
            order = [prompt_ids[i] for i in indices]
            # Prompts still pending from the last pass go to the END of the new pass, so the batch
            # that straddles two passes never holds the same prompt twice.
            pending = set(stream)
            stream.extend(
                [pid for pid in order if pid not in pending] + [pid for pid in order if pid in pending]
            )
        batches.append(tuple(stream[:size]))
        stream = stream[size:]
    return batches
