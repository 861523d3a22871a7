import json
import subprocess
import sys

import numpy as np
import pytest

from asp_scheduler.cli import main
from asp_scheduler.schedule import Schedule


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ablate_writes_the_documented_json(tmp_path, capsys):
    lengths = np.random.default_rng(0).lognormal(7, 0.6, 32 * 6 * 4).round() + 1
    src = _write_jsonl(tmp_path / "l.jsonl", [{"response_tokens": float(x)} for x in lengths])
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    argv = ["ablate", "--lengths", str(src), "--tau", "0.64", "--tau", "1.0", "--seeds", "2", "--calibrate"]
    assert main([*argv, "--sa-iterations", "20000", "--json", str(out), "--markdown", str(md)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["tau"] for r in results] == [0.64, 1.0]
    assert abs(results[0]["measured_tau"] - 0.64) <= 0.02
    assert set(results[0]["seed_mean"]) == {"C0", "C1", "C2", "C3", "C4", "C4_calibrated"}
    assert set(results[0]["seed_mean"]["C4"]) == {"dispersion", "padding", "group_cv", "group_spread"}
    oracle = results[1]["seed_mean"]
    assert oracle["C2"]["padding"] < oracle["C0"]["padding"]  # sorting on the truth must cut padding
    assert "group_cv" in md.read_text()


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "empty"),
        ([{"other": 1}], "missing"),
        ([{"response_tokens": "long"}], "not a number"),
        ([{"response_tokens": -3}], ">= 0"),
    ],
)
def test_ablate_rejects_bad_length_files(tmp_path, capsys, rows, message):
    src = _write_jsonl(tmp_path / "bad.jsonl", rows)
    assert main(["ablate", "--lengths", str(src), "--tau", "0.64", "--json", str(tmp_path / "o.json")]) == 2
    assert message in capsys.readouterr().out


def test_ablate_rejects_bad_sizes(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", [{"response_tokens": float(i + 1)} for i in range(20)])
    base = ["ablate", "--lengths", str(src), "--tau", "0.5", "--json", str(tmp_path / "o.json")]
    for extra, message in [
        (["--b", "0"], "b "),
        (["--kappa", "-1"], "kappa"),
        (["--k", "0"], "k "),
        ([], "b=32"),
    ]:
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().out


def test_schedule_command_round_trips_prompt_ids(tmp_path, capsys):
    ids = [f"p{i}" for i in range(100)]
    prompts = _write_jsonl(tmp_path / "p.jsonl", [{"prompt_id": i, "prompt": "q"} for i in ids])
    preds = _write_jsonl(
        tmp_path / "pred.jsonl", [{"prompt_id": i, "predicted_length": 10.0 + j} for j, i in enumerate(ids)]
    )
    out = tmp_path / "s.json"
    argv = ["schedule", "--prompts", str(prompts), "--predictions", str(preds), "--out", str(out)]
    assert main([*argv, "--sa-iterations", "1000"]) == 0
    s = Schedule.load(out)
    assert sorted(sum(([s.item_ids[j] for j in m] for m in s.minibatches), [])) == sorted(ids)
    assert s.predictor["name"] == "from_file"


def test_demo_runs_and_writes_a_schedule(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["demo", "--out", str(out), "--num-prompts", "600", "--sa-iterations", "20000"]) == 0
    printed = capsys.readouterr().out
    assert "C0 (file order)" in printed and "ASP" in printed
    assert len(Schedule.load(out).predicted_lengths) == 600


def test_importing_the_package_does_not_import_torch():
    code = "import sys, asp_scheduler, asp_scheduler.predictors, asp_scheduler.cli; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def test_predictors_export_every_predictor_and_load_the_lm_one_lazily():
    code = (
        "import sys; from asp_scheduler.predictors import FilePredictor, TextFeaturePredictor; "
        "print('asp_scheduler.predictors.lm_regressor' in sys.modules); "
        "from asp_scheduler.predictors import LMRegressor; print(LMRegressor.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "LMRegressor"]
