"""Preprocess prompts: ``python cli/preprocess_data.py <config name or path> [key=value ...]``.

A bare name resolves to ``configs/datasets/<name>.yaml``; ``key=value`` overrides any config key
(e.g. ``input=./my.jsonl max_prompt_length=512``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from mindspeed_rl.datasets.preprocess import PreprocessConfig, run_preprocess

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "datasets"


def resolve_config_path(name_or_path: str, config_dir: Path = CONFIG_DIR) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    named = config_dir / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if named.is_file():
        return named
    known = sorted(p.stem for p in config_dir.glob("*.yaml")) if config_dir.is_dir() else []
    raise ValueError(f"no config file {name_or_path!r} and no {named}; known dataset configs: {known}")


def load_config(name_or_path: str, overrides: list[str], config_dir: Path = CONFIG_DIR) -> PreprocessConfig:
    from omegaconf import OmegaConf

    path = resolve_config_path(name_or_path, config_dir)
    merged = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))
    raw: Any = OmegaConf.to_container(merged, resolve=True)
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping of preprocess keys")
    return PreprocessConfig.from_mapping(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", help="config name in configs/datasets/ or a YAML path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument(
        "--config-dir", type=Path, default=CONFIG_DIR, help="where bare config names are looked up"
    )
    args = parser.parse_args(argv)
    # Warnings (prompts with unknown characters) in the same one-line form as errors.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        config = load_config(args.config, args.overrides, args.config_dir)
        path, drops = run_preprocess(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {drops.num_kept} prompts to {path}")
    print(f"drop report: {drops.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
