"""Ask pip's resolver, without installing, whether one stack resolves for one target machine.

A target is a stack, a ``platform_machine`` and a Python minor version. The question goes to
pip 26's own resolver as a dry run (``pip install --dry-run --report --ignore-installed
--only-binary=:all: --platform ... --python-version ... --target ...``) through
tools/pip_for_target.py, which makes pip evaluate environment markers for the target instead of
this machine.

What pip cannot fetch from here is offered to it as a *stand-in*: a metadata-only wheel (no
code) with the real distribution's name, version and declared requirements, recorded in
``STAND_INS`` of mindspeed_rl/_pins.py with where each was read. That covers packages from other
indexes (PyTorch's CPU index, Ascend's), built from source (MindSpeed from git, vLLM with
``VLLM_TARGET_DEVICE=empty``) or sdist-only on PyPI (a cross-platform resolution takes wheels
only). Everything else comes from the registry itself, so a conflict anywhere in the rest of the
set is pip's real answer. The machine's own pip configuration (find-links, constraints, extra
indexes) is switched off for the question, so the answer is the registry's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
GLIBC_MINOR = 35
"""The newest manylinux level offered: glibc 2.35 (Ubuntu 22.04, the CANN and CUDA base images;
openEuler 24.03 has 2.38). vllm-ascend 0.23's wheels need 2.34."""

# The pip settings that would change the answer; the rest (certificates, proxy, the index itself,
# timeouts) stay as this machine configures them.
_KEPT_PIP_VARIABLES = {
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_PROXY",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_RETRIES",
}


@dataclass(frozen=True, slots=True)
class Target:
    stack: str
    platform: str
    python: str


@dataclass(slots=True)
class Resolution:
    target: Target
    resolved: bool
    conflict: str | None
    versions: dict[str, str] = field(default_factory=dict)
    stand_ins: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "stack": self.target.stack,
            "platform": self.target.platform,
            "python": self.target.python,
            "resolved": self.resolved,
            "conflict": self.conflict,
            "packages": len(self.versions),
            "stand_ins": self.stand_ins,
            "seconds": round(self.seconds, 1),
            "versions": dict(sorted(self.versions.items())),
        }


def marker_environment(platform: str, python: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython ``python`` on Linux ``platform``."""
    return {
        "platform_machine": platform,
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def platform_tags(platform: str, glibc_minor: int = GLIBC_MINOR) -> list[str]:
    """Every wheel platform tag a manylinux ``platform`` host with glibc 2.``glibc_minor`` runs;
    pip takes ``--platform`` values literally, so the whole ladder is spelled out."""
    tags = [f"manylinux_2_{minor}_{platform}" for minor in range(glibc_minor, 16, -1)]
    tags.append(f"manylinux2014_{platform}")
    if platform == "x86_64":
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    return [*tags, f"linux_{platform}"]


def stand_in_name(spec: str) -> tuple[str, str]:
    """``"name==version"`` -> (name, version)."""
    requirement = Requirement(spec)
    (pin,) = requirement.specifier
    if pin.operator != "==":
        raise ValueError(f"a stand-in is one exact version, got {spec!r}")
    return requirement.name, pin.version


def resolver_lines(
    stack: Mapping[str, Any], stand_ins: Mapping[str, Any], platform: str, python: str
) -> list[str]:
    """The stack's requirements as pip's input for one target.

    Markers are evaluated here for the target (pip would evaluate them for this machine);
    a direct reference (``name @ git+...``) becomes its stand-in's exact version; what the
    stack builds before or after ``pip install -r`` is added as the requirement it provides.
    """
    environment = marker_environment(platform, python)
    by_name = {canonicalize_name(stand_in_name(spec)[0]): spec for spec in stand_ins}
    lines = []
    for line in stack["requirements"]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
            continue
        if requirement.url is not None:
            spec = by_name.get(canonicalize_name(requirement.name))
            if spec is None:
                raise ValueError(
                    f"{line!r} is a direct reference that pip cannot resolve for another platform; "
                    "give it a stand-in in STAND_INS of mindspeed_rl/_pins.py"
                )
            lines.append(spec)
            continue
        requirement.marker = None
        lines.append(str(requirement))
    for step in [*stack["before"], *stack["after"]]:
        lines.append(step["provides"])
    return lines


def write_stand_in(directory: Path, spec: str, requires: Iterable[str], note: str) -> Path:
    """A metadata-only wheel for ``spec`` (``name==version``) declaring ``requires``."""
    name, version = stand_in_name(spec)
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    path = directory / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {note}"]
    metadata += [f"Requires-Dist: {line}" for line in requires]
    wheel = [
        "Wheel-Version: 1.0",
        "Generator: tools/stack_resolver.py",
        "Root-Is-Purelib: true",
        "Tag: py3-none-any",
    ]
    files = {f"{info}/METADATA": "\n".join(metadata) + "\n", f"{info}/WHEEL": "\n".join(wheel) + "\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def pip_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the pip settings that would bend the answer, and with no config file."""
    kept = {k: v for k, v in base.items() if not k.startswith("PIP_") or k in _KEPT_PIP_VARIABLES}
    return {**kept, "PIP_CONFIG_FILE": os.devnull}


def pip_command(
    target: Target,
    requirements_file: Path,
    *,
    find_links: Path,
    report: Path,
    workdir: Path,
    index_urls: Sequence[str] = (),
    offline: bool = False,
) -> list[str]:
    """The dry-run command; ``offline`` keeps pip to ``find_links`` (the tests use it)."""
    abi = "cp" + target.python.replace(".", "")
    command = [sys.executable, str(HERE / "pip_for_target.py")]
    command += [json.dumps(marker_environment(target.platform, target.python))]
    command += ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:"]
    for tag in platform_tags(target.platform):
        command += ["--platform", tag]
    command += ["--python-version", target.python, "--implementation", "cp", "--abi", abi]
    command += ["--target", str(workdir / "target"), "--report", str(report)]
    # Not -q: pip prints "The conflict is caused by" at the info level.
    command += [
        "--find-links",
        str(find_links),
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
    ]
    if offline:
        command.append("--no-index")
    for url in index_urls:
        command += ["--extra-index-url", url]
    return [*command, "-r", str(requirements_file)]


def resolve(
    target: Target,
    stack: Mapping[str, Any],
    stand_ins: Mapping[str, Any],
    workdir: Path,
    *,
    timeout: float = 900,
    with_stack_indexes: bool = False,
    offline: bool = False,
) -> Resolution:
    """One dry run; never raises for a conflict (it is the answer), only for a broken check."""
    workdir.mkdir(parents=True, exist_ok=True)
    links = workdir / "stand_ins"
    links.mkdir(exist_ok=True)
    offered = applicable_stand_ins(stand_ins, target.platform)
    for spec, entry in offered.items():
        write_stand_in(links, spec, entry["requires"], f"stand-in: {entry['from']}")
    lines = resolver_lines(stack, stand_ins, target.platform, target.python)
    requirements_file = workdir / "requirements.txt"
    requirements_file.write_text("\n".join(lines) + "\n")
    report = workdir / "report.json"
    report.unlink(missing_ok=True)
    indexes = stack["index_urls"] if with_stack_indexes else ()
    command = pip_command(
        target,
        requirements_file,
        find_links=links,
        report=report,
        workdir=workdir,
        index_urls=indexes,
        offline=offline,
    )
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=pip_environment(os.environ)
        )
    except subprocess.TimeoutExpired:
        return Resolution(
            target, False, f"pip did not answer within {timeout:.0f} s", seconds=time.monotonic() - start
        )
    seconds = time.monotonic() - start
    if done.returncode != 0 or not report.exists():
        return Resolution(target, False, conflict_summary(done.stderr + done.stdout), seconds=seconds)
    versions = versions_from_report(json.loads(report.read_text()))
    used = sorted(spec for spec in offered if _stand_in_used(spec, versions))
    return Resolution(target, True, None, versions, used, seconds)


def applicable_stand_ins(stand_ins: Mapping[str, Any], platform: str) -> dict[str, Any]:
    """The stand-ins for ``platform``: an entry with ``platforms`` exists there only (PyTorch's
    ``+cpu`` builds would otherwise also satisfy ``torch==X`` on aarch64, where PyPI's wheel is
    the one torch-npu names)."""
    return {spec: e for spec, e in stand_ins.items() if platform in e.get("platforms", [platform])}


def _stand_in_used(spec: str, versions: Mapping[str, str]) -> bool:
    name, version = stand_in_name(spec)
    return versions.get(canonicalize_name(name)) == version


def versions_from_report(report: Mapping[str, Any]) -> dict[str, str]:
    """``{canonical name: version}`` of everything pip's installation report would install."""
    return {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]
    }


_CONFLICT_HEADER = "The conflict is caused by:"


def conflict_summary(output: str) -> str:
    """pip's reason for a failed resolution, in one line.

    ResolutionImpossible: the "conflict is caused by" lines (who wants what), joined. A missing
    distribution: the requirement, who asked for it and the versions that exist. Else the last
    error line pip printed.
    """
    lines = [line.rstrip() for line in output.splitlines()]
    if _CONFLICT_HEADER in lines:
        start = lines.index(_CONFLICT_HEADER) + 1
        causes = []
        for line in lines[start:]:
            if not line.strip():
                break
            causes.append(line.strip())
        return "; ".join(_conflicting(causes))
    for line in lines:
        missing = re.match(
            r"ERROR: Could not find a version that satisfies the requirement (.+?)(?: \(from versions: (.*)\))?$",
            line,
        )
        if missing:
            wanted, available = missing.group(1), missing.group(2)
            if available is None or available == "none":
                return f"no distribution of {wanted} for this target"
            return f"no distribution of {wanted} for this target (found: {_shorten(available)})"
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    errors = [e for e in errors if not e.startswith("Ignored the following")] or errors
    return errors[-1] if errors else (lines[-1] if lines else "pip failed without a message")


_REQUESTED = re.compile(r"The user requested (.+)$")
_DEPENDS = re.compile(r"(.+?) depends on (.+)$")


def _conflicting(causes: list[str]) -> list[str]:
    """Of pip's cause lines, the exact versions asked for and the requirements that exclude
    them (pip also lists the ones that agree); all of them when nothing was asked exactly."""
    asked: dict[str, str] = {}
    for cause in causes:
        found = _REQUESTED.match(cause)
        if found:
            requirement = _parse(found.group(1))
            exact = [s.version for s in requirement.specifier if s.operator == "=="] if requirement else []
            if requirement is not None and exact:
                asked[canonicalize_name(requirement.name)] = exact[0]
    if not asked:
        return causes
    kept = []
    for cause in causes:
        found = _DEPENDS.match(cause)
        if found is None:
            if _REQUESTED.match(cause):
                kept.append(cause)
            continue
        requirement = _parse(found.group(2).replace(" and ", ","))
        version = None if requirement is None else asked.get(canonicalize_name(requirement.name))
        if (
            requirement is None
            or version is None
            or not requirement.specifier.contains(version, prereleases=True)
        ):
            kept.append(cause)
    return kept if len(kept) > 1 else causes


def _parse(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except ValueError:
        return None


def _shorten(versions: str, keep: int = 6) -> str:
    items = [v.strip() for v in versions.split(",")]
    return ", ".join(items) if len(items) <= keep else "..., " + ", ".join(items[-keep:])
