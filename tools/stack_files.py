"""The per-role stacks of mindspeed_rl/_pins.py as requirement files (``stacks/<name>.txt``).

_pins.py is the single source; the files are rendered from it (``python tools/check_stacks.py
--write``) and tests/tools/test_stacks.py fails when they are not current. A file is what
``pip install -r`` takes (its ``--extra-index-url`` lines included), with the steps pip cannot
do (source builds, builds against the installed torch) written above and below as comments.
"""

from __future__ import annotations

import runpy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.stack_resolver import Target, stand_in_name

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "mindspeed_rl" / "_pins.py"
STACK_DIR = ROOT / "stacks"
RECORD = STACK_DIR / "resolved.json"


def load_pins(path: Path = PINS) -> dict[str, Any]:
    """_pins.py's names, loaded by path as setup.py does (no package import)."""
    return runpy.run_path(str(path))


def targets(stacks: Mapping[str, Any]) -> Iterator[Target]:
    for name, stack in stacks.items():
        for platform in stack["platforms"]:
            yield Target(name, platform, stack["python"])


def stand_ins_of(stack: Mapping[str, Any], stand_ins: Mapping[str, Any]) -> list[str]:
    """The STAND_INS specs a stack names: its exact pins, its direct references (by name) and
    what its build steps provide."""
    pinned: set[tuple[str, str]] = set()
    referenced: set[str] = set()
    for line in [*stack["requirements"], *(s["provides"] for s in [*stack["before"], *stack["after"]])]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if requirement.url is not None:
            referenced.add(name)
        pinned.update((name, s.version) for s in requirement.specifier if s.operator == "==")
    found = []
    for spec in stand_ins:
        raw, version = stand_in_name(spec)
        key = canonicalize_name(raw)
        if (key, version) in pinned or key in referenced:
            found.append(spec)
    return found


def render(name: str, stack: Mapping[str, Any], stand_ins: Mapping[str, Any]) -> str:
    """The text of ``stacks/<name>.txt``."""
    out = [
        f"# stacks/{name}.txt: {stack['role']}.",
        "# GENERATED from mindspeed_rl/_pins.py by `python tools/check_stacks.py --write`: edit _pins.py.",
        f"# Python {stack['python']} on Linux {' and '.join(stack['platforms'])} (manylinux, glibc >= 2.35), on {stack['host']}.",
        "# `make check-stacks` asks pip's resolver whether this set resolves for each platform (a dry run,",
        "# nothing installed); its last answer is in stacks/resolved.json.",
        "#",
        "# Install, in a fresh environment of that Python:",
    ]
    step = 1
    for before in stack["before"]:
        out.append(f"#   {step}. {before['provides']}, built from source first:")
        out += [f"#        {command}" for command in before["steps"]]
        step += 1
    out.append(f"#   {step}. pip install -r stacks/{name}.txt")
    step += 1
    for after in stack["after"]:
        out.append(f"#   {step}. {after['provides']}: {after['why']}.")
        out += [f"#        {command}" for command in after["steps"]]
        step += 1
    out.append(
        f"#   {step}. pip install --no-deps -e .   (this repository; its dependencies are the lines below)"
    )
    sources = stand_ins_of(stack, stand_ins)
    if sources:
        out += [
            "#",
            "# Not from PyPI's wheels (the resolver check offers each as its declared requirements):",
        ]
        out += [f"#   {spec}: {stand_ins[spec]['from']}" for spec in sources]
    out.append("")
    out += [f"--extra-index-url {url}" for url in stack["index_urls"]]
    out += list(stack["requirements"])
    return "\n".join(out) + "\n"


def rendered(pins: Mapping[str, Any]) -> dict[Path, str]:
    """Every stack file's path and expected text."""
    stand_ins = pins["STAND_INS"]
    return {
        STACK_DIR / f"{name}.txt": render(name, stack, stand_ins) for name, stack in pins["STACKS"].items()
    }


def stale_files(pins: Mapping[str, Any]) -> list[Path]:
    """Stack files that differ from what _pins.py renders, or are missing, or are left over."""
    expected = rendered(pins)
    stale = [path for path, text in expected.items() if not path.exists() or path.read_text() != text]
    leftover = [p for p in sorted(STACK_DIR.glob("*.txt")) if p not in expected]
    return stale + leftover
