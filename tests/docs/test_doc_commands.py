"""Every shell command in the docs and the README is run, or checked and marked why it is not.

Fence convention (docs/reference/doc-commands.md):

* ```` ```bash ````: cheap on CPU; every line is executed from the repository root and must exit 0,
  or the code a trailing ``# exit N`` names. ``python cli/check_config.py ARGS`` runs in-process
  (``check_config.main``), everything else in ``bash -c`` with ``python`` on PATH as this
  interpreter.
* ```` ```bash long ````: CPU but minutes; ```` ```bash device-only ````: needs a GPU/NPU or several
  machines; ```` ```bash template ````: needs the reader's files (``<...>`` placeholders). These are
  checked without running: the script or module exists and defines every ``--flag``, a
  ``--config-name`` exists, a ``make`` target exists, a ``pip`` extra exists; a training command's
  config and overrides pass ``check_config``; a long command's entry point names the end-to-end
  tests that cover it (``COVERED_BY``).

Anything else on a shell fence fails, so a command cannot slip in untested.
"""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli import check_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", "shell-session", "sh-session"}
TAGS = {"", "long", "device-only", "template"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)\s*(?P<rest>[^`]*)$")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")
EXPECT = re.compile(r"#\s*exit\s+(\d+)(?::|\s*$)")  # "# exit 2" or "# exit 2: why"
HYDRA_FLAGS = {"--config-name", "--config-dir", "--help", "-h"}
TRAIN_ENTRIES = ("cli/train_grpo.py", "cli/train_dapo.py")
PY = ("python", "python3", ".venv/bin/python")
# Long commands' entry points and the end-to-end tests that run them (docs/reference/doc-commands.md);
# benchmarks/ are measurements, checked statically only.
COVERED_BY = {
    "cli/train_grpo.py": [
        "tests/mindspeed_rl/trainer/test_async_e2e.py",
        "tests/mindspeed_rl/trainer/test_hybrid_e2e.py",
        "tests/mindspeed_rl/trainer/test_megatron_async_e2e.py",
        "tests/mindspeed_rl/trainer/test_tp2_actor_e2e.py",
        "tests/mindspeed_rl/trainer/test_async_transports_e2e.py",
        "tests/mindspeed_rl/trainer/test_resume_e2e.py",
    ],
    "cli/train_dapo.py": ["tests/mindspeed_rl/trainer/test_dapo_e2e.py"],
    "cli/check_config.py": ["tests/cli/test_placement_dry_run.py"],
    "cli/simulate.py": ["tests/cli/test_simulate.py"],
    "examples/ray_launch.sh": ["tests/mindspeed_rl/test_launcher.py"],
    "examples/grpo_qwen3_30b_asp.sh": ["tests/mindspeed_rl/test_launcher_role_envs.py"],
    "examples/data/preprocess_data.sh": ["tests/cli/test_preprocess_data.py"],
    "cli/plot_metrics.py": ["tests/mindspeed_rl/utils/test_plots.py"],
    "cli/sandbox_server.py": ["tests/mindspeed_rl/tools/test_sandbox_server.py"],
    "cli/retrieval_server.py": ["tests/mindspeed_rl/tools/test_search_tool.py"],
    "asp_scheduler": ["tests/asp_scheduler/test_bench.py"],
    "make demo": ["tests/mindspeed_rl/trainer/test_async_e2e.py"],
    "make test": ["the suite itself"],
    "make test-mcore012": [".ci/run"],
    "make lint": [".ci/run"],
    "make format": ["ruff"],
    "make typecheck": [".ci/run"],
    "make docs": [".ci/run"],
    "make bench": ["tests/asp_scheduler/test_bench.py"],
    "bash .ci/run": ["CI"],
}


@dataclass(frozen=True)
class Command:
    path: Path
    line: int
    tag: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Fence:
    path: Path
    line: int
    lang: str
    tag: str
    body: list[str]


def fences(path: Path) -> Iterator[Fence]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, start = m["fence"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1
        yield Fence(path, start + 1, m["lang"], m["rest"].strip(), body)


def commands(fence: Fence) -> Iterator[Command]:
    pending, first = "", 0
    for offset, raw in enumerate(fence.body, start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        first = first or offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield Command(fence.path, fence.line + first, fence.tag, pending + line)
        pending, first = "", 0


def all_fences() -> list[Fence]:
    return [f for path in DOCS for f in fences(path)]


def shell_commands() -> list[Command]:
    return [c for f in all_fences() if f.lang == "bash" for c in commands(f)]


def runnable() -> list[Command]:
    return [c for c in shell_commands() if c.tag == ""]


def _unique(commands: list[Command]) -> list[Command]:
    """The first place each command text appears: a command the docs repeat runs once."""
    first: dict[str, Command] = {}
    for c in commands:
        first.setdefault(" ".join(shlex.split(c.text, comments=True)), c)
    return list(first.values())


def not_run() -> list[Command]:
    return [c for c in shell_commands() if c.tag != ""]


# --- the fence rules ------------------------------------------------------------------------------


def test_every_shell_fence_carries_a_known_tag() -> None:
    bad = [
        f"{f.path.relative_to(ROOT)}:{f.line}: ```{f.lang} {f.tag}".rstrip()
        for f in all_fences()
        if f.lang in SHELL_LANGS and (f.lang != "bash" or f.tag not in TAGS)
    ]
    assert not bad, f"use ```bash with no tag or one of long, device-only, template: {bad}"
    assert len(runnable()) >= 20 and len(not_run()) >= 20  # the docs do hold commands of both kinds


def test_runnable_commands_have_no_placeholders_and_check_config_is_always_run() -> None:
    placeholders = [c.where for c in runnable() if PLACEHOLDER.search(c.text)]
    assert not placeholders, f"a command with <placeholders> belongs in ```bash template: {placeholders}"
    unrun = [
        c.where
        for c in not_run()
        if "cli/check_config.py" in c.text and "--placement-dry-run" not in c.text and c.tag != "template"
    ]
    assert not unrun, f"check_config commands are cheap: put them in a plain ```bash block: {unrun}"


# --- running the cheap ones -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_on_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``python`` on PATH is this interpreter (a wrapper, not a symlink: a virtual environment's
    interpreter finds its packages from the path it is started by)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    for name in ("python", "python3"):
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize("command", _unique(runnable()), ids=lambda c: c.where)
def test_runnable_command_exits_as_documented(
    command: Command, python_on_path: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = int(m[1]) if (m := EXPECT.search(command.text)) else 0
    words = shlex.split(command.text, comments=True)
    if words[:2] in (["python", "cli/check_config.py"], ["python3", "cli/check_config.py"]):
        try:  # in-process: the same main, no interpreter start-up
            code = check_config.main(words[2:])
        except SystemExit as exited:  # argparse's --help and usage errors
            code = exited.code if isinstance(exited.code, int) else 1
        out = capsys.readouterr()
        assert code == expected, f"{command.where}: {command.text}\n{out.err[-2000:]}"
        return
    done = subprocess.run(
        ["bash", "-c", command.text],
        cwd=ROOT,
        env=python_on_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == expected, f"{command.where}: {command.text}\n{done.stderr[-2000:]}"


# --- checking the others --------------------------------------------------------------------------


def _segments(text: str) -> Iterator[list[str]]:
    """The simple commands of a line (split at &&, ||, ;, |), env assignments dropped."""
    words = shlex.split(text, comments=True)
    current: list[str] = []
    for w in [*words, "&&"]:
        if w in ("&&", "||", ";", "|"):
            while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                current.pop(0)
            if current:
                yield current
            current = []
        else:
            current.append(w)


def _entry(words: list[str]) -> tuple[str | None, list[str]]:
    """(entry point, its arguments): a script path, ``-m`` package, ``make target``, or None."""
    if words[0] in PY:
        if words[1:2] == ["-m"]:
            return words[2], words[3:]
        return words[1], words[2:]
    if words[0] == "bash" and len(words) > 1:
        return words[1], words[2:]
    if words[0] == "make":
        return f"make {words[1] if len(words) > 1 else ''}".strip(), []
    return None, words


def _module_file(entry: str) -> Path:
    if entry.endswith((".py", ".sh")) or "/" in entry:
        return ROOT / entry
    base = ROOT / entry.replace(".", "/")
    return base / "__main__.py" if base.is_dir() else base.with_suffix(".py")


IMPORT = re.compile(
    r"^\s*from\s+((?:cli|benchmarks|asp_scheduler|mindspeed_rl|tools)[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)",
    re.M,
)


def _sources(path: Path, depth: int = 3, seen: set[Path] | None = None) -> str:
    """``path``'s text and that of the repository modules it imports, ``depth`` levels deep."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        return ""
    seen.add(path)
    text = path.read_text()
    if depth == 0 or path.suffix != ".py":
        return text
    for module, names in IMPORT.findall(text):
        base = ROOT / module.replace(".", "/")
        candidates = [base.with_suffix(".py"), base / "__init__.py"]
        candidates += [base / f"{name}.py" for name in re.findall(r"\w+", names.split("#")[0])]
        for candidate in candidates:
            text += _sources(candidate, depth - 1, seen)
    return text


def _static_problems(command: Command) -> list[str]:
    problems: list[str] = []
    for words in _segments(command.text):
        entry, args = _entry(words)
        if words[0] == "pip":
            extras = runpy.run_path(str(ROOT / "mindspeed_rl" / "_pins.py"))["EXTRAS"]
            for spec in re.findall(r"\.\[([\w,]+)\]", " ".join(words)):
                problems += [f"no pip extra {e!r}" for e in spec.split(",") if e not in extras]
            continue
        if entry is None:
            continue
        if entry.startswith("make"):
            target = entry.split()[1]
            if not re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.M):
                problems.append(f"no make target {target!r}")
            continue
        source_file = _module_file(entry)
        if not source_file.is_file():
            problems.append(f"{entry} does not exist")
            continue
        source = _sources(source_file)
        for flag in sorted({a.split("=")[0] for a in args if a.startswith("--")} - HYDRA_FLAGS):
            # argparse declares "--flag" literally; a shell script matches it in a case pattern.
            known = (
                flag in source
                if source_file.suffix == ".sh"
                else f'"{flag}"' in source or f"'{flag}'" in source
            )
            if not known:
                problems.append(f"{entry} defines no {flag}")
        if "--config-name" in args and "--config-dir" not in args:
            name = args[args.index("--config-name") + 1]
            if not PLACEHOLDER.search(name) and not (ROOT / "configs" / f"{name}.yaml").is_file():
                problems.append(f"no configs/{name}.yaml")
    return problems


@pytest.mark.parametrize("command", not_run(), ids=lambda c: f"{c.tag}:{c.where}")
def test_commands_not_run_name_real_scripts_flags_and_configs(command: Command) -> None:
    assert not _static_problems(command), f"{command.where}: {command.text}"


def _training_args(command: Command) -> list[str] | None:
    """check_config's arguments for a training command with a config and no placeholders."""
    for words in _segments(command.text):
        entry, args = _entry(words)
        if entry in TRAIN_ENTRIES and "--config-name" in args and not PLACEHOLDER.search(command.text):
            return args
    return None


@pytest.mark.parametrize(
    "command",
    _unique([c for c in not_run() if _training_args(c) is not None]),
    ids=lambda c: f"{c.tag}:{c.where}",
)
def test_training_commands_not_run_pass_check_config(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _training_args(command)
    assert args is not None
    code = check_config.main(args)
    assert code == 0, f"{command.where}: {command.text}\n{capsys.readouterr().err[-2000:]}"


def test_long_commands_name_the_tests_that_cover_them() -> None:
    uncovered = []
    for command in (c for c in not_run() if c.tag == "long"):
        for words in _segments(command.text):
            entry, _ = _entry(words)
            if entry is None or entry.startswith("benchmarks/") or entry.startswith("benchmarks."):
                continue
            key = "bash .ci/run" if entry == ".ci/run" else entry
            if key not in COVERED_BY:
                uncovered.append(f"{command.where}: {key}")
    assert not uncovered, f"add the covering e2e tests to COVERED_BY and the docs' table: {uncovered}"
    missing = [
        t
        for tests in COVERED_BY.values()
        for t in tests
        if t.startswith("tests/") and not (ROOT / t).exists()
    ]
    assert not missing


def test_the_fence_parser_sees_tags_indented_fences_and_continuations(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```bash long\npython a.py \\\n  --x 1   # why\n# a comment\n\nmake demo\n```\n\n"
        "- item\n\n  ```bash\n  echo hi  # exit 0\n  ```\n\n```{toctree}\nx\n```\n"
    )
    found = list(fences(page))
    assert [(f.lang, f.tag) for f in found] == [("bash", "long"), ("bash", ""), ("{toctree}", "")]
    assert [c.text for c in commands(found[0])] == ["python a.py  --x 1   # why", "make demo"]
    assert [c.line for c in commands(found[0])] == [4, 8]
    bad = Command(page, 1, "long", "python cli/train_grpo.py --config-name no_such --no-such-flag")
    assert _static_problems(bad) == ["cli/train_grpo.py defines no --no-such-flag", "no configs/no_such.yaml"]
    assert _static_problems(Command(page, 1, "long", "make no-such-target")) == [
        "no make target 'no-such-target'"
    ]
    assert _static_problems(Command(page, 1, "device-only", 'pip install -e ".[gpu,tpu]"')) == [
        "no pip extra 'tpu'"
    ]


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    """Sphinx checks the site's links (make docs, -W); the README is not part of the site."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local and not [t for t in local if not (ROOT / t).exists()]


def test_the_readme_stays_a_front_door() -> None:
    """At most 250 lines, the status table on the first screen, no measurement-log dates or hashes
    (those belong to docs/benchmarks/)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert any(line.startswith("## What runs where") for line in lines[:40])
    dated = [
        n for n, line in enumerate(lines, 1) if re.search(r"\b20\d\d-\d\d-\d\d\b|\b[0-9a-f]{7,40}\b", line)
    ]
    assert not dated, f"README lines with a date or a commit hash: {dated}"
