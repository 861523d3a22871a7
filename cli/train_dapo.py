"""DAPO training entry point, under upstream MindSpeed-RL's name:

    python cli/train_dapo.py --config-name dapo_tiny_asp [--config-dir DIR] [key=value ...]

DAPO here is GRPO with four of ``rl_config``'s switches (``stage: ray_dapo`` is accepted by both
entry points): ``clip_higher_enable`` (asymmetric clip), ``token_level_loss``, the soft overlong
penalty (``overlong_buffer_enable``) and dynamic sampling (``filter_groups_enable``), in either
pipeline. Everything else — Hydra composition, the run directory, Ray, the trainer — is
``cli/train_grpo.py``'s; this entry point only says at start which DAPO parts the config turns on.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `cli` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli import train_grpo

if __name__ == "__main__":
    train_grpo.main(entry="dapo")
