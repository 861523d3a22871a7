"""The end-to-end tests' policy models, built once per session and copied into each test's folder.

A CLI run whose model folder is missing builds a random-init tiny model there and SFT-warms it
(``trainer/policy_model.py``): on a 2-core host several seconds of every run, before Ray starts,
for a folder that is the same in every run of the same config. ``PolicyModels.provide`` builds it
once per distinct build (name, architecture, seed, warm-up) with the production function, then
copies it to the folder the test's run names; the run finds it there with a matching build record
and goes straight on, as a user's second run would. The shipped demo's test does not use this:
its run builds its own model, as ``make demo`` does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.policy_model import prepare_policy_model

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TOKENIZER_KEY = "megatron_training.tokenizer_name_or_path"


class PolicyModels:
    """Built models under ``root``, one folder per distinct build."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def provide(self, dest: Path, config_name: str, overrides: Sequence[str] = ()) -> Path:
        """Put the model that ``config_name`` + ``overrides`` would build at ``dest`` (the run's
        ``tokenizer_name_or_path``); a no-op when ``dest`` exists (a resumed run's second start)."""
        if dest.exists():
            return dest
        kept = [o for o in overrides if not o.lstrip("+").startswith(f"{TOKENIZER_KEY}=")]
        config = load_config_from_files(CONFIGS, config_name, [*kept, f"{TOKENIZER_KEY}={dest}"])
        plan = build_run_plan(config)
        if plan.model.initial_weights is not None or not plan.model.build_if_missing:
            raise ValueError(f"{config_name}: the run does not build its model; nothing to provide")
        spec = plan.model
        build = {  # what decides the folder's contents (the build record's fields)
            "name": spec.name,
            "arch": dict(spec.build_arch),
            "seed": spec.build_seed,
            "warmup": None if plan.warmup is None else dataclasses.asdict(plan.warmup),
        }
        digest = hashlib.sha256(json.dumps(build, sort_keys=True, default=str).encode()).hexdigest()[:16]
        built = self._root / digest
        if not built.exists():
            staging = self._root / f".{digest}.building"
            shutil.rmtree(staging, ignore_errors=True)
            import torch

            threads = torch.get_num_threads()  # the warm-up sets 1 for its process: this one's
            try:
                prepare_policy_model(dataclasses.replace(plan.model, path=str(staging)), plan.warmup)
            finally:
                torch.set_num_threads(threads)
            staging.rename(built)
        shutil.copytree(built, dest)
        return dest
