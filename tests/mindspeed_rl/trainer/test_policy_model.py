"""The policy folder: an absent one is built only when asked, with an error naming the switch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.models.training.hf_folder import BUILD_RECORD, copy_non_weight_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.trainer.policy_model import prepare_policy_model

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_missing_model_folder_without_build_flag_names_the_fix(tmp_path: Path) -> None:
    config = load_config_from_files(
        CONFIGS,
        "grpo_tiny_cpu",
        (
            f"megatron_training.tokenizer_name_or_path={tmp_path / 'absent'}",
            "rl_config.build_model_if_missing=false",
        ),
    )
    plan = build_run_plan(config)
    with pytest.raises(ValueError, match="build_model_if_missing"):
        prepare_policy_model(plan.model, plan.warmup)


def test_finetune_load_must_be_an_hf_folder(tmp_path: Path) -> None:
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_cpu", (f"++actor_config.load={tmp_path}", "++actor_config.finetune=true")
    )
    plan = build_run_plan(config)
    with pytest.raises(ValueError, match="not an HF model folder"):
        prepare_policy_model(plan.model, plan.warmup)
    (tmp_path / "config.json").write_text("{}")
    assert prepare_policy_model(plan.model, plan.warmup) == tmp_path


def test_a_reused_model_built_with_other_settings_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "tiny"
    config = load_config_from_files(
        CONFIGS, "grpo_tiny_cpu", (f"megatron_training.tokenizer_name_or_path={folder}",)
    )
    plan = build_run_plan(config)
    assert plan.warmup is not None
    caplog.set_level(logging.WARNING, logger="mindspeed_rl.trainer.policy_model")
    assert prepare_policy_model(plan.model, None) == folder  # built without a warm-up
    assert json.loads((folder / BUILD_RECORD).read_text())["warmup"] is None
    prepare_policy_model(plan.model, None)
    assert not caplog.records  # reused as built: nothing to say
    prepare_policy_model(plan.model, plan.warmup)  # this config would warm it up: still reused, said
    (record,) = caplog.records
    assert "built with other warmup" in record.getMessage() and "delete the folder" in record.getMessage()
    caplog.clear()
    out = tmp_path / "final_model"  # a model trained from it: the record is not true of it
    out.mkdir()
    copy_non_weight_files(folder, out)
    assert (out / "config.json").is_file() and not (out / BUILD_RECORD).exists()
    (folder / BUILD_RECORD).unlink()  # a folder from elsewhere: nothing to compare
    prepare_policy_model(plan.model, plan.warmup)
    assert not caplog.records
