"""asp_config's online keys: honoured values load, a streaming window is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_online_keys_load_and_window_is_refused() -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_asp", ("++asp_config.online=true", "++asp_config.replan_interval=3")
    )
    assert config.asp_config.online and config.asp_config.replan_interval == 3
    assert config.asp_config.window is None
    with pytest.raises(Exception, match=r"asp_config\.window: streaming prompts .* not implemented yet"):
        load_config_from_files(CONFIGS, "grpo_tiny_asp", ("++asp_config.window=4",))
