"""GRPO training entry point, launched as upstream MindSpeed-RL users do:

    python cli/train_grpo.py --config-name grpo_tiny_cpu [--config-dir DIR] [key=value ...]

Hydra composes the YAML (defaults list, overrides); the typed config decides everything else.
One key, ``rl_config.pipeline``, picks the trainer: ``hybrid`` (upstream's alternating loop) or
``async`` (the ASP pipeline). Each run writes ``<run_dir>/<timestamp>_<config-name>/`` with the
resolved config; Ray is joined or started by ``mindspeed_rl.utils.ray_setup``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import hydra
import yaml
from omegaconf import DictConfig

from mindspeed_rl.config_cls import ConfigError, GRPOConfig, InertKey, inert, load_config
from mindspeed_rl.config_cls.loader import SELF_WARNING, schema_overrides
from mindspeed_rl.config_cls.notes import batch_notes
from mindspeed_rl.plan.sections import plan_inert_keys
from mindspeed_rl.tools.config import ToolEntry, read_tool_config
from mindspeed_rl.tools.embedded_servers import EmbeddedServerError, embedded_servers
from mindspeed_rl.utils import quiet_logs, ray_setup

if __package__ in (None, ""):  # run as a script: make `cli` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli import checkpoint_hooks, fault_hooks

if TYPE_CHECKING:
    from mindspeed_rl.trainer.async_inputs import RunHooks

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
TRAINERS = {
    "hybrid": "mindspeed_rl.trainer.grpo_trainer_hybrid",
    "async": "mindspeed_rl.trainer.grpo_trainer_async",
}
# Hydra would otherwise create outputs/<date>/<time>/, save .hydra/ and a log file there and take
# over logging; upstream users expect relative paths and logs to behave as in a plain script.
# A user's own hydra.* / hydra/* override of the same key wins.
HYDRA_DEFAULTS = (
    "hydra.run.dir=.",
    "hydra.output_subdir=null",
    "hydra.job.chdir=false",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
)
EXIT_CONFIG, EXIT_TRAINER = 2, 3

logger = logging.getLogger("train_grpo")


def with_hydra_defaults(args: Sequence[str]) -> list[str]:
    given = {a.lstrip("+").split("=", 1)[0] for a in args if "=" in a}
    overrides = schema_overrides(args)
    return [*overrides, *(d for d in HYDRA_DEFAULTS if d.split("=", 1)[0] not in given)]


def resolve_trainer(pipeline: str) -> ModuleType:
    """The trainer module for ``pipeline``; a clear error when it is not available."""
    module_name = TRAINERS[pipeline]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise  # the trainer exists but one of its own imports is missing: show the real cause
        raise ValueError(
            f"rl_config.pipeline={pipeline} needs {module_name}, which is not in this installation; "
            f"choose another pipeline ({', '.join(p for p in TRAINERS if p != pipeline)}) or install it"
        ) from err
    if not callable(getattr(module, "train", None)):
        raise ValueError(f"{module_name} has no train(config, run_dir) function")
    return module


def create_run_dir(config: GRPOConfig, config_name: str, now: dt.datetime | None = None) -> Path:
    """``<run_dir>/<timestamp>_<config-name>/`` (a numeric suffix when two runs share a second)."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(config.run_dir) / f"{stamp}_{config_name}"
    candidate, suffix = base, 1
    while True:
        try:
            candidate.mkdir(parents=True, exist_ok=False)
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = base.with_name(f"{base.name}-{suffix}")


def write_resolved_config(config: GRPOConfig, run_dir: Path) -> None:
    resolved = config.to_dict()
    (run_dir / "config_resolved.json").write_text(json.dumps(resolved, indent=2) + "\n")
    (run_dir / "config_resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))


def run_hooks(config: GRPOConfig, env: Mapping[str, str]) -> RunHooks | None:
    """Test-only knobs from the environment (``cli/fault_hooks.py``, ``cli/checkpoint_hooks.py``);
    None, as in production, when it sets none."""
    faults = fault_hooks.faults_from_env(config, env)
    hold = checkpoint_hooks.hold_iteration_for(config, env)
    if faults is None and hold is None:
        return None
    from mindspeed_rl.trainer.async_inputs import RunHooks
    from mindspeed_rl.workers.fault_plan import FaultPlan

    return RunHooks(faults=faults or FaultPlan(), checkpoint_hold_iteration=hold)


def dapo_parts(config: GRPOConfig) -> str:
    """Which of DAPO's four parts ``config`` turns on (logged by ``cli/train_dapo.py``)."""
    rl = config.rl_config
    parts = {
        "clip_higher": rl.clip_higher_enable,
        "token_level_loss": rl.token_level_loss,
        "overlong_penalty": rl.overlong_buffer_enable,
        "dynamic_sampling": rl.filter_groups_enable,
    }
    return ", ".join(f"{name}={'on' if on else 'off'}" for name, on in parts.items())


def warn_inert_keys(keys: Sequence[InertKey]) -> None:
    """The keys the user set that have no effect, once per run at start-up: one line per section,
    each reason the one of the engine and pipeline that run (``check_config`` lists them too)."""
    if keys:
        logger.warning("%d given key(s) have no effect here (check_config lists them):", len(keys))
    for line in inert.grouped_lines(keys):
        logger.warning("  %s", line)


def run(cfg: DictConfig, config_name: str | None, entry: str = "grpo") -> int:
    """Validate, prepare the run directory, start Ray, hand over to the trainer. Returns an exit code."""
    if not config_name:
        print("error: pass --config-name NAME (a run YAML in configs/ or --config-dir)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(cfg)
        trainer = resolve_trainer(config.rl_config.pipeline)
        inert_keys = plan_inert_keys(config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_TRAINER
    warn_inert_keys(inert_keys)
    for note in batch_notes(config):
        logger.info("note: %s", note)
    if entry == "dapo":
        logger.info("DAPO: %s", dapo_parts(config))
    run_dir = create_run_dir(config, config_name)
    write_resolved_config(config, run_dir)
    hooks = run_hooks(config, os.environ)
    with contextlib.ExitStack() as servers:
        try:
            # Before Ray: the local sandbox / retriever the tools point at must answer from the
            # first call, and a server that cannot start fails the run before any actor does.
            servers.enter_context(embedded_servers(tool_entries(config), run_dir / "servers"))
        except (EmbeddedServerError, ValueError) as err:  # ValueError: the tool YAML itself
            print(f"error: {err}", file=sys.stderr)
            return EXIT_TRAINER
        return _start_and_train(config, trainer, run_dir, hooks)


def tool_entries(config: GRPOConfig) -> tuple[ToolEntry, ...]:
    """The run's tool config entries (none for single-turn runs)."""
    rl = config.rl_config
    if not rl.multi_turn_enable or rl.tool_config_path is None:
        return ()
    return read_tool_config(rl.tool_config_path)


def _start_and_train(config: GRPOConfig, trainer: ModuleType, run_dir: Path, hooks: RunHooks | None) -> int:
    try:
        cluster = ray_setup.init_ray(config)
    except ConnectionError as err:  # a refused join: the message names the token and the fix
        print(f"error: {err}", file=sys.stderr)
        return EXIT_TRAINER
    logger.info(
        "run %s: pipeline=%s, ray %s %s", run_dir, config.rl_config.pipeline,
        "joined" if cluster.attached else "started", cluster.address,
    )  # fmt: skip
    from mindspeed_rl.utils.role_env_check import RoleEnvError

    try:
        if hooks is None:
            trainer.train(config, run_dir)
        else:
            trainer.train(config, run_dir, hooks=hooks)
    except RoleEnvError as err:  # a role's environment cannot run it: the message names it and the fix
        print(f"error: {err}", file=sys.stderr)
        return EXIT_TRAINER
    return 0


@hydra.main(config_path=CONFIGS, config_name=None, version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    # SystemExit passes through Hydra's job runner (it only catches Exception).
    raise SystemExit(run(cfg, HydraConfig.get().job.config_name, _ENTRY[0]))


_ENTRY = ["grpo"]  # which entry point called main(); hydra.main passes no argument of ours


def main(argv: Sequence[str] | None = None, *, entry: str = "grpo") -> None:
    """``entry``: "grpo" (this file) or "dapo" (``cli/train_dapo.py``)."""
    _ENTRY[0] = entry
    quiet_logs.install()  # before anything logs; MINDSPEED_RL_LOG=debug shows everything
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    warnings.filterwarnings("ignore", message=SELF_WARNING)
    args = list(sys.argv[1:] if argv is None else argv)
    # hydra.main reads sys.argv itself; it is the only way to hand it our defaults.
    saved, sys.argv = sys.argv, [sys.argv[0], *with_hydra_defaults(args)]
    try:
        _hydra_entry()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
