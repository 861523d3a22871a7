"""The ``rollout_correction`` section through the loader and the plan: resolution of ``mode: null``
per pipeline, the old log-probs the Training Unit computes for each mode, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_rl.config_cls import ConfigError, load_config_from_files
from mindspeed_rl.plan.build import build_run_plan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RC = "++rollout_correction"


def _plan(name: str, *overrides: str):  # type: ignore[no-untyped-def]
    return build_run_plan(load_config_from_files(CONFIGS, name, overrides))


@pytest.mark.parametrize("name", ["grpo_tiny_asp", "grpo_tiny_cpu"])
def test_no_section_or_all_null_is_no_correction_and_todays_old_log_probs(name: str) -> None:
    want = "rollout" if name == "grpo_tiny_asp" else "current"
    for overrides in ((), (f"{RC}.mode=null", f"{RC}.rollout_is=null")):
        trainer = _plan(name, *overrides).trainer
        assert trainer.engine.loss.rollout_correction is None
        assert trainer.old_log_probs == want


def test_acceptance_config_is_decoupled_loglinear_without_an_extra_forward() -> None:
    trainer = _plan("grpo_tiny_asp", f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=2.0",
                    f"{RC}.mode=decoupled", f"{RC}.prox_logp=loglinear").trainer  # fmt: skip
    rc = trainer.engine.loss.rollout_correction
    assert rc is not None and (rc.mode, rc.prox_logp, rc.rollout_is, rc.is_upper) == (
        "decoupled",
        "loglinear",
        "token",
        2.0,
    )
    assert trainer.old_log_probs == "rollout"


@pytest.mark.parametrize(
    ("name", "overrides", "mode", "old"),
    [
        (
            "grpo_tiny_asp",
            (f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.5"),
            "bypass",
            "rollout",
        ),
        ("grpo_tiny_cpu", (f"{RC}.rollout_is=token",), "decoupled", "current"),
        ("grpo_tiny_asp", (f"{RC}.mode=decoupled", f"{RC}.rollout_is=token"), "decoupled", "recompute"),
        ("grpo_tiny_cpu", (f"{RC}.mode=bypass",), "bypass", "rollout"),
        (
            "grpo_tiny_cpu",
            (f"{RC}.mode=decoupled", "++rl_config.mini_batch_size=16"),
            "decoupled",
            "recompute",
        ),
    ],
)
def test_mode_null_resolves_per_pipeline(name: str, overrides: tuple[str, ...], mode: str, old: str) -> None:
    trainer = _plan(name, *overrides).trainer
    rc = trainer.engine.loss.rollout_correction
    assert rc is not None and rc.mode == mode
    assert trainer.old_log_probs == old


def test_lo_hi_threshold_string() -> None:
    rc = _plan(
        "grpo_tiny_asp", f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold='0.5_2.0'"
    ).trainer.engine.loss
    assert rc.rollout_correction is not None and rc.rollout_correction.is_bounds == (0.5, 2.0)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ((f"{RC}.mode=offpolicy",), "['bypass', 'decoupled']"),
        ((f"{RC}.mode=decoupled", f"{RC}.prox_logp=cheap"), "['recompute', 'loglinear']"),
        ((f"{RC}.mode=bypass", f"{RC}.prox_logp=loglinear"), "only applies to mode: decoupled"),
        ((f"{RC}.rollout_rs=seq_mean_k3",), "go together"),
    ],
)
def test_bad_values_name_the_fix(overrides: tuple[str, ...], needle: str) -> None:
    with pytest.raises(ValueError) as err:
        _plan("grpo_tiny_asp", *overrides)
    assert needle in str(err.value)


def test_unknown_key_is_refused_by_the_loader() -> None:
    with pytest.raises(ConfigError, match="rollout_is"):
        load_config_from_files(CONFIGS, "grpo_tiny_asp", (f"{RC}.rollout_iss=token",))
