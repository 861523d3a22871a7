"""cli/train_grpo.py: Hydra argument handling, run directory, dispatch on rl_config.pipeline.

The trainers and Ray are replaced by recorders: this tests the entry point, not training.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hydra.core.global_hydra import GlobalHydra

from cli import train_grpo
from mindspeed_rl.config_cls import GRPOConfig, load_config
from mindspeed_rl.utils import ray_setup

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def _fresh_hydra() -> Any:
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, GRPOConfig, Path]]:
    recorded: list[tuple[str, GRPOConfig, Path]] = []
    for pipeline, module_name in train_grpo.TRAINERS.items():
        module = types.ModuleType(module_name)
        module.train = lambda config, run_dir, _p=pipeline: recorded.append((_p, config, run_dir))  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module_name, module)
    cluster = ray_setup.RayCluster(address="127.0.0.1:1", attached=False, resources={"CPU": 2.0})
    monkeypatch.setattr(ray_setup, "init_ray", lambda config: cluster)
    return recorded


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "my_configs"
    (directory / "model").mkdir(parents=True)
    shutil.copy(REPO_CONFIGS / "grpo_tiny_cpu.yaml", directory / "tiny_run.yaml")
    shutil.copy(REPO_CONFIGS / "model" / "tiny_qwen3.yaml", directory / "model")
    return directory


def _main(args: list[str]) -> Any:
    with pytest.raises(SystemExit) as info:
        train_grpo.main(args)
    return info.value.code


def test_hybrid_run_gets_a_run_dir_with_the_resolved_config(
    calls: list[tuple[str, GRPOConfig, Path]],
    config_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv_before = list(sys.argv)
    assert _main(["--config-dir", str(config_dir), "--config-name", "tiny_run", "run_dir=out"]) == 0
    assert sys.argv == argv_before
    [(pipeline, config, run_dir)] = calls
    assert pipeline == "hybrid" and config.rl_config.pipeline == "hybrid"
    assert run_dir.parent == Path("out") and run_dir.name.endswith("_tiny_run")
    assert load_config(json.loads((run_dir / "config_resolved.json").read_text())) == config
    assert (run_dir / "config_resolved.yaml").is_file()
    # Hydra's output dir, .hydra/ folder and log file are switched off.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_configs", "out"]


def test_pipeline_override_dispatches_to_the_async_trainer(
    calls: list[tuple[str, GRPOConfig, Path]], config_dir: Path, tmp_path: Path
) -> None:
    args = ["--config-dir", str(config_dir), "--config-name", "tiny_run", f"run_dir={tmp_path}/r"]
    assert _main([*args, "rl_config.pipeline=async", "megatron_training.train_iters=2"]) == 0
    [(pipeline, config, _)] = calls
    assert pipeline == "async" and config.megatron_training.training.train_iters == 2


def test_repo_configs_are_the_default_config_path(
    calls: list[tuple[str, GRPOConfig, Path]], tmp_path: Path
) -> None:
    assert _main(["--config-name", "grpo_tiny_asp", f"run_dir={tmp_path}"]) == 0
    assert calls[0][0] == "async"


def test_missing_trainer_fails_with_a_clear_message(
    calls: list[tuple[str, GRPOConfig, Path]],
    config_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, train_grpo.TRAINERS["async"], None)  # import fails as if absent
    args = ["--config-dir", str(config_dir), "--config-name", "tiny_run", f"run_dir={tmp_path}/r"]
    assert _main([*args, "rl_config.pipeline=async"]) == train_grpo.EXIT_TRAINER
    err = capsys.readouterr().err
    assert "rl_config.pipeline=async needs mindspeed_rl.trainer.grpo_trainer_async" in err
    assert "choose another pipeline (hybrid)" in err and "Traceback" not in err
    assert calls == [] and not (tmp_path / "r").exists()  # nothing started, no run dir


def test_invalid_config_exits_before_ray(
    calls: list[tuple[str, GRPOConfig, Path]], config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--config-dir", str(config_dir), "--config-name", "tiny_run", "rl_config.mini_batch_size=3"]
    assert _main(args) == train_grpo.EXIT_CONFIG
    assert "rl_config.mini_batch_size: 3 prompts per optimizer step" in capsys.readouterr().err
    assert calls == []


def test_missing_config_name_is_explained(
    calls: list[tuple[str, GRPOConfig, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main([]) == train_grpo.EXIT_CONFIG
    assert "pass --config-name NAME" in capsys.readouterr().err


def test_hydra_defaults_never_override_the_users_own_hydra_settings() -> None:
    args = train_grpo.with_hydra_defaults(["x=1", "hydra.run.dir=/elsewhere", "+hydra/job_logging=default"])
    assert args[:3] == ["x=1", "hydra.run.dir=/elsewhere", "+hydra/job_logging=default"]
    assert train_grpo.with_hydra_defaults(["a.b=1"])[0] == "++a.b=1"  # schema keys absent from the YAML
    assert "hydra.run.dir=." not in args and "hydra/job_logging=none" not in args
    assert {"hydra.output_subdir=null", "hydra.job.chdir=false", "hydra/hydra_logging=none"} <= set(args)


def test_run_dirs_of_runs_started_in_the_same_second_do_not_collide(tmp_path: Path) -> None:
    config = load_config(json.loads(json.dumps(_tiny_dict(tmp_path))))
    first = train_grpo.create_run_dir(config, "x")
    second = train_grpo.create_run_dir(config, "x", now=_parse_stamp(first.name))
    assert first != second and second.name == f"{first.name}-2"


def _tiny_dict(tmp_path: Path) -> dict[str, Any]:
    from mindspeed_rl.config_cls import load_config_from_files

    return load_config_from_files(REPO_CONFIGS, "grpo_tiny_cpu", [f"run_dir={tmp_path}"]).to_dict()


def _parse_stamp(name: str) -> Any:
    import datetime as dt

    return dt.datetime.strptime(name.split("_", 1)[0], "%Y%m%d-%H%M%S")


def test_test_hooks_come_from_the_environment_and_production_gets_none(tmp_path: Path) -> None:
    from cli.checkpoint_hooks import HOLD_ENV
    from cli.fault_hooks import FAULTS_ENV
    from mindspeed_rl.config_cls import load_config_from_files

    asp = load_config_from_files(REPO_CONFIGS, "grpo_tiny_asp", [f"run_dir={tmp_path}"])
    assert train_grpo.run_hooks(asp, {}) is None
    hooks = train_grpo.run_hooks(asp, {FAULTS_ENV: "gu:1:2", HOLD_ENV: "4"})
    assert hooks is not None and hooks.faults.gu_dies == {1: 2} and hooks.checkpoint_hold_iteration == 4
    hold_only = train_grpo.run_hooks(asp, {HOLD_ENV: "2"})
    assert hold_only is not None and not hold_only.faults.gu_dies and hold_only.checkpoint_hold_iteration == 2
    for bad in ("0", "x", "1.5"):
        with pytest.raises(ValueError, match=f"{HOLD_ENV}='{bad}': give the iteration"):
            train_grpo.run_hooks(asp, {HOLD_ENV: bad})
    hybrid = load_config_from_files(REPO_CONFIGS, "grpo_tiny_cpu", [f"run_dir={tmp_path}"])
    with pytest.raises(ValueError, match="pipeline=async only"):
        train_grpo.run_hooks(hybrid, {HOLD_ENV: "2"})


def test_inert_keys_warn_once_at_start_one_line_per_section_with_the_engines_reason(
    calls: list[tuple[str, GRPOConfig, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="train_grpo"):
        assert _main(["--config-name", "grpo_qwen3_30b_a3b_asp_A3", f"+run_dir={tmp_path}"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "train_grpo"]
    header, *sections = lines
    assert header.startswith("13 given key(s) have no effect here")
    assert sorted(line.split(":")[0].strip() for line in sections) == [
        "actor_config", "megatron_training", "model.qwen3_30b_a3b",
    ]  # fmt: skip
    [megatron] = [line for line in sections if line.strip().startswith("megatron_training:")]
    assert (
        "| distributed_backend: the megatron engine picks the backend from the trainer's device" in megatron
    )
    assert not [line for line in lines if "torch" in line]  # the megatron engine runs: no torch reason


def _search_tools_yaml(path: Path, url: str, corpus: Path | None) -> Path:
    corpus_line = f"      corpus_path: {corpus}\n" if corpus is not None else ""
    path.write_text(
        "tools:\n"
        "  - class_name: mindspeed_rl.tools.search_tool.SearchTool\n"
        "    config:\n"
        f"      retrieval_service_url: {url}\n"
        f"{corpus_line}"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: search\n"
        "        parameters: {type: object, properties: {query_list: {type: array}}, required: [query_list]}\n"
    )
    return path


def test_a_run_starts_the_local_retriever_its_tools_need_and_stops_it(
    config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trainer is a recorder (no Ray): it checks the retriever answers while the run trains.
    from mindspeed_rl.tools.config import read_tool_config
    from mindspeed_rl.tools.embedded_servers import listening
    from mindspeed_rl.tools.search_tool import SearchTool

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": "Nile\nA river of Africa."}) + "\n")
    tools = _search_tools_yaml(tmp_path / "tools.yaml", f"http://127.0.0.1:{port}/retrieve", corpus)
    answers: list[str] = []

    def train(config: GRPOConfig, run_dir: Path) -> None:
        (entry,) = read_tool_config(tools)
        answers.append(SearchTool(entry.config, entry.tool_schema).execute({"query_list": ["river"]}).text)

    module = types.ModuleType(train_grpo.TRAINERS["hybrid"])
    module.train = train  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, train_grpo.TRAINERS["hybrid"], module)
    cluster = ray_setup.RayCluster(address="127.0.0.1:1", attached=False, resources={"CPU": 2.0})
    monkeypatch.setattr(ray_setup, "init_ray", lambda config: cluster)
    args = [
        "--config-dir", str(config_dir), "--config-name", "tiny_run", f"run_dir={tmp_path}/r",
        "++rl_config.multi_turn_enable=true", f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=1", "++rl_config.max_parallel_calls=1",
    ]  # fmt: skip
    assert _main(args) == 0
    (answer,) = answers
    assert "Doc 1 (Title: Nile)" in json.loads(answer)["result"]
    assert not listening("127.0.0.1", port)  # stopped with the run
    (run_dir,) = (tmp_path / "r").iterdir()
    assert (
        (run_dir / "servers" / f"retrieval_server_{port}.log").read_text().startswith("retrieval server on")
    )


def test_a_local_retriever_that_cannot_be_started_fails_the_run_before_ray(
    calls: list[tuple[str, GRPOConfig, Path]],
    config_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    tools = _search_tools_yaml(tmp_path / "tools.yaml", f"http://127.0.0.1:{port}/retrieve", None)
    args = [
        "--config-dir", str(config_dir), "--config-name", "tiny_run", f"run_dir={tmp_path}/r",
        "++rl_config.multi_turn_enable=true", f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=1", "++rl_config.max_parallel_calls=1",
    ]  # fmt: skip
    assert _main(args) == train_grpo.EXIT_TRAINER
    err = capsys.readouterr().err
    assert "set corpus_path in the tool config" in err and "Traceback" not in err
    assert calls == []
