"""Decode-model fitting, the fit-decode command, and the shipped preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindspeed_rl.sim.__main__ import main as sim_main
from mindspeed_rl.sim.fit import DecodeRun, fit_decode, read_runs, write_runs
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.runner import duty_cycle_estimate, eq4_constant

PRESET = Path(__file__).resolve().parents[3] / "configs" / "sim" / "qwen3_30b_a3b.yaml"


def _runs(a: float, b: float, c: float) -> list[DecodeRun]:
    return [
        DecodeRun(batch_size=bs, num_steps=s, seconds=c + a * s + b * bs * s)
        for bs in (1, 4, 16)
        for s in (16, 64, 128)
    ]


def test_fit_recovers_exact_coefficients() -> None:
    fit = fit_decode(_runs(0.004, 0.0002, 0.05))
    assert fit.model.per_step_seconds == pytest.approx(0.004, rel=1e-6)
    assert fit.model.per_token_seconds == pytest.approx(0.0002, rel=1e-6)
    assert fit.model.per_minibatch_seconds == pytest.approx(0.05, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.max_relative_error < 1e-6


def test_fit_needs_two_batch_sizes() -> None:
    with pytest.raises(ValueError, match="two batch sizes"):
        fit_decode([DecodeRun(batch_size=4, num_steps=s, seconds=float(s)) for s in (8, 16)])


def test_fit_decode_command_reads_num_tokens_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.jsonl"
    rows = [{"batch_size": r.batch_size, "num_tokens": r.batch_size * r.num_steps, "seconds": r.seconds}
            for r in _runs(0.01, 0.001, 0.0)]  # fmt: skip
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r.num_steps for r in read_runs(runs)][:3] == [16, 64, 128]
    out = tmp_path / "fit.json"
    assert sim_main(["fit-decode", "--runs", str(runs), "--no-overhead", "--json", str(out)]) == 0
    assert "per_step_seconds: 0.01" in capsys.readouterr().out
    assert json.loads(out.read_text())["decode"]["per_token_seconds"] == pytest.approx(0.001)
    write_runs(tmp_path / "again.jsonl", read_runs(runs))
    assert len(read_runs(tmp_path / "again.jsonl")) == 9


def test_shipped_preset_loads_and_reproduces_eq4_and_duty_cycle() -> None:
    preset = SimPreset.from_yaml(PRESET)
    assert preset.reference.t_gen_seconds == 763.3
    assert eq4_constant(preset.profile, 763.3) == pytest.approx(3.29, abs=0.01)  # paper: d_off ~ Q + 3.3
    assert duty_cycle_estimate(preset.profile, 763.3) == pytest.approx(0.912, abs=0.001)
    runtime = preset.runtime_config(8)
    assert runtime.num_prompts_per_global_batch == 16 and runtime.max_policy_lag is None


def test_preset_typos_are_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(PRESET.read_text().replace("num_generation_units:", "num_generation_unit:"))
    with pytest.raises(ValueError, match="num_generation_unit"):
        SimPreset.from_yaml(bad)


@pytest.mark.slow
def test_measure_decode_on_the_tiny_model(tmp_path: Path) -> None:
    """Times real fixed-length decodes with the HF engine on this CPU, then fits them."""
    from mindspeed_rl.models.tiny import create_tiny_model
    from mindspeed_rl.sim.measure import measure_decode_runs, tiny_arch

    model = create_tiny_model(tmp_path / "tiny", tiny_arch())
    runs = measure_decode_runs(model, batch_sizes=(1, 4), steps=(4, 16))
    assert [(r.batch_size, r.num_steps) for r in runs] == [(1, 4), (1, 16), (4, 4), (4, 16)]
    fit = fit_decode(runs)
    assert fit.model.per_step_seconds + fit.model.per_token_seconds > 0
