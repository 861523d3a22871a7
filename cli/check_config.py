"""Validate a GRPO config without running it.

    python cli/check_config.py --config-name grpo_tiny_cpu [--config-dir DIR] [key=value ...]

Prints the resolved, typed config as JSON (stdout) and exits 0; on a bad config prints what is
wrong and how to fix it (stderr, no traceback) and exits 2. Keys that have no effect on the torch
backend are listed on stderr (``--list-inert`` prints only that list, on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mindspeed_rl.config_cls import ConfigError, load_config_from_files

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Validate a GRPO config and print it resolved, as JSON.")
    parser.add_argument("--config-dir", type=Path, default=REPO_CONFIGS, help="folder of run YAMLs")
    parser.add_argument("--config-name", required=True, help="run YAML name, without .yaml")
    parser.add_argument("--list-inert", action="store_true", help="print only the keys with no effect here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rl_config.pipeline=async")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config_from_files(args.config_dir, args.config_name, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.list_inert:
        for key in config.inert_keys:
            print(key)
        return 0
    print(json.dumps(config.to_dict(), indent=2))
    if config.inert_keys:
        print(f"note: {len(config.inert_keys)} given key(s) have no effect here:", file=sys.stderr)
        for key in config.inert_keys:
            print(f"  {key}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
