"""asp_config's online and streaming keys: honoured values load; a window where it cannot work is
refused by name, with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_online_keys_load() -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_asp", ("++asp_config.online=true", "++asp_config.replan_interval=3")
    )
    assert config.asp_config.online and config.asp_config.replan_interval == 3
    assert config.asp_config.window is None


def test_window_loads_on_the_async_pipeline() -> None:
    config = load_config_from_files(CONFIGS, "grpo_tiny_asp", ("++asp_config.window=4",))
    assert config.asp_config.window == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("++asp_config.window=0",), r"asp_config\.window: must be a number of global batches >= 1"),
        (("++asp_config.window=2", "++rl_config.pipeline=hybrid"), r"rl_config\.pipeline: async"),
        (("++asp_config.window=2", "++asp_config.schedule_path=x.json"), r"unset one of the two"),
    ],
)
def test_window_refused_where_it_cannot_stream(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception, match=message):
        load_config_from_files(CONFIGS, "grpo_tiny_asp", overrides)
