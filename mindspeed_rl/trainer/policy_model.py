"""The policy's HF folder for a run: the configured one, a finetune's initial weights, or a tiny
random-init model built (and optionally SFT-warmed) on first use.

Both trainers call it once, before any data work; it reads only the plan's ``ModelSpec`` and
``WarmupSpec``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.models.tokenizer import load_tokenizer
from mindspeed_rl.models.training.hf_folder import BUILD_RECORD

if TYPE_CHECKING:
    from mindspeed_rl.plan.build import ModelSpec
    from mindspeed_rl.plan.sections import WarmupSpec

logger = logging.getLogger(__name__)
# BUILD_RECORD is written beside a model this module built: how it was built, so a later run can
# tell a reused folder from the one its own config would build (a folder left by a run with other
# settings, e.g. a short or no warm-up, trains visibly worse and would otherwise pass unnoticed).


def prepare_policy_model(spec: ModelSpec, warmup: WarmupSpec | None) -> Path:
    """Return the policy folder, creating (and warming up) a fresh model there if asked to.

    ``load`` with ``finetune: true`` (``spec.initial_weights``) replaces the folder: an HF
    checkpoint such as one this framework saved (weights and tokenizer files together). The
    warm-up runs only when the folder is created by this call: re-running a config never
    re-trains an existing model behind the user's back.
    """
    if spec.initial_weights is not None:
        initial = Path(spec.initial_weights)
        if not (initial / "config.json").is_file():
            raise ValueError(
                f"actor_config.load={initial} (finetune: true) is not an HF model folder (no config.json); "
                "point it at a saved checkpoint, e.g. <run dir>/final_model"
            )
        return initial
    path = Path(spec.path)
    if path.exists():
        _warn_if_built_otherwise(path, _build_record(spec, warmup))
        return path
    if not spec.build_if_missing:
        raise ValueError(
            f"model folder {path} does not exist; download/convert an HF checkpoint there, or set "
            "rl_config.build_model_if_missing: true to create a tiny random-init model"
        )
    from mindspeed_rl.models.tiny import create_tiny_model

    logger.info("creating a random-init %s model at %s", spec.name, path)
    create_tiny_model(path, dict(spec.build_arch), seed=spec.build_seed)
    if warmup is not None:
        _run_warmup(warmup, path)
    (path / BUILD_RECORD).write_text(json.dumps(_build_record(spec, warmup), indent=1, sort_keys=True))
    return path


def _build_record(spec: ModelSpec, warmup: WarmupSpec | None) -> dict[str, Any]:
    return {
        "name": spec.name,
        "arch": dict(spec.build_arch),
        "seed": spec.build_seed,
        "warmup": None if warmup is None else _warmup_record(warmup),
    }


def _warmup_record(warmup: WarmupSpec) -> dict[str, Any]:
    record = dataclasses.asdict(warmup)
    if record["task"] == "demo":
        del record["task"]  # folders built before the task field was recorded stay "as configured"
    return record


def _warn_if_built_otherwise(path: Path, wanted: dict[str, Any]) -> None:
    """A folder this module built under other settings is still used (never rebuilt behind the
    user's back), but the run says so, naming what differs and how to rebuild."""
    record = path / BUILD_RECORD
    if not record.is_file():
        return
    built = json.loads(record.read_text())
    differ = sorted(
        k for k in wanted if json.dumps(built.get(k), sort_keys=True) != json.dumps(wanted[k], sort_keys=True)
    )
    if differ:
        logger.warning(
            "reusing the model at %s, built with other %s than this config asks for (built: %s; asked: %s); "
            "delete the folder to build it as configured",
            path,
            " / ".join(differ),
            {k: built.get(k) for k in differ},
            {k: wanted[k] for k in differ},
        )


def _run_warmup(warm: WarmupSpec, path: Path) -> None:
    import torch

    from mindspeed_rl.datasets.arith_tools_task import arith_tools_sft_pairs
    from mindspeed_rl.datasets.demo_task import demo_sft_pairs
    from mindspeed_rl.models.training.sft_warmup import sft_warmup

    # The tiny model's matmuls are far too small to amortise a second OpenMP thread, and spinning
    # threads collapse throughput when the cores are shared (measured: >10x slower with 2).
    torch.set_num_threads(1)
    stats = sft_warmup(
        path,
        load_tokenizer(path),
        (arith_tools_sft_pairs if warm.task == "arith_tools" else demo_sft_pairs)(
            warm.num_examples, warm.seed
        ),
        steps=warm.steps,
        lr=warm.lr,
        batch_size=warm.batch_size,
        seed=warm.seed,
    )
    logger.info("SFT warm-up: %s", {k: round(v, 4) for k, v in stats.items()})
