"""The resolver check's own logic, offline: pip's real resolver runs with ``--no-index`` over
stand-in wheels this test writes, so the parsing, the marker handling and the stand-ins are tested
against pip's actual behaviour without the registry."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tools.check_stacks import merged, table
from tools.stack_resolver import (
    Resolution,
    Target,
    applicable_stand_ins,
    conflict_summary,
    pip_environment,
    platform_tags,
    resolve,
    resolver_lines,
    versions_from_report,
    write_stand_in,
)


def _stack(*requirements: str, before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> dict:
    return {
        "requirements": list(requirements),
        "index_urls": [],
        "before": [{"provides": p, "steps": []} for p in before],
        "after": [{"provides": p, "steps": [], "why": ""} for p in after],
    }


def _entry(*requires: str, platforms: list[str] | None = None) -> dict:
    entry: dict = {"from": "test", "requires": list(requires), "read_from": "test"}
    if platforms is not None:
        entry["platforms"] = platforms
    return entry


def test_resolver_lines_evaluate_markers_for_the_target_and_map_sources() -> None:
    stand_ins = {"mindspeed==0.12.1": _entry(), "vllm==0.23.0+empty": _entry()}
    stack = _stack(
        "numpy==1.26.0",
        'torch==2.7.1; platform_machine == "aarch64"',
        'torch==2.7.1+cpu; platform_machine == "x86_64"',
        'six==1.17.0; python_version > "3.11"',
        "mindspeed @ git+https://gitcode.com/Ascend/MindSpeed.git@26.1.0_core_r0.12.1",
        before=("vllm==0.23.0+empty",),
    )
    arm = resolver_lines(stack, stand_ins, "aarch64", "3.11")
    assert arm == ["numpy==1.26.0", "torch==2.7.1", "mindspeed==0.12.1", "vllm==0.23.0+empty"]
    x86 = resolver_lines(stack, stand_ins, "x86_64", "3.12")
    assert x86 == [
        "numpy==1.26.0",
        "torch==2.7.1+cpu",
        "six==1.17.0",
        "mindspeed==0.12.1",
        "vllm==0.23.0+empty",
    ]


def test_a_direct_reference_without_a_stand_in_is_refused() -> None:
    stack = _stack("mindspeed @ git+https://gitcode.com/Ascend/MindSpeed.git@26.1.0_core_r0.12.1")
    with pytest.raises(ValueError, match="give it a stand-in in STAND_INS"):
        resolver_lines(stack, {}, "x86_64", "3.11")


def test_platform_limited_stand_ins_are_offered_there_only() -> None:
    stand_ins = {"torch==2.7.1+cpu": _entry(platforms=["x86_64"]), "mindspeed==0.12.1": _entry()}
    assert set(applicable_stand_ins(stand_ins, "aarch64")) == {"mindspeed==0.12.1"}
    assert set(applicable_stand_ins(stand_ins, "x86_64")) == set(stand_ins)


def test_platform_tags_cover_the_manylinux_ladder() -> None:
    tags = platform_tags("aarch64")
    # vllm-ascend 0.23 ships manylinux_2_34, megatron-core 0.12.1 manylinux_2_24, numba manylinux2014.
    assert {
        "manylinux_2_35_aarch64",
        "manylinux_2_34_aarch64",
        "manylinux_2_24_aarch64",
        "manylinux2014_aarch64",
    } <= set(tags)
    assert "manylinux_2_36_aarch64" not in tags and not any("x86_64" in t for t in tags)
    assert "manylinux1_x86_64" in platform_tags("x86_64")


def test_this_machines_pip_settings_do_not_reach_the_question() -> None:
    env = pip_environment(
        {"PIP_FIND_LINKS": "/opt/wheels", "PIP_CONSTRAINT": "c.txt", "PIP_CERT": "ca.crt", "PATH": "/bin"}
    )
    assert env["PIP_CERT"] == "ca.crt" and env["PATH"] == "/bin"
    assert "PIP_FIND_LINKS" not in env and "PIP_CONSTRAINT" not in env
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


def test_stand_in_wheel_carries_name_version_and_requirements(tmp_path: Path) -> None:
    path = write_stand_in(
        tmp_path, "transformer-engine-torch==2.20.2", ["torch>=2.1", 'x; python_version > "3.11"'], "n"
    )
    assert path.name == "transformer_engine_torch-2.20.2-py3-none-any.whl"
    with zipfile.ZipFile(path) as wheel:
        metadata = wheel.read("transformer_engine_torch-2.20.2.dist-info/METADATA").decode()
    assert "Name: transformer-engine-torch\nVersion: 2.20.2\n" in metadata
    assert 'Requires-Dist: torch>=2.1\nRequires-Dist: x; python_version > "3.11"\n' in metadata


# --- pip's real resolver, offline over stand-ins ---------------------------------------------


def _offline(stack: dict, stand_ins: dict, tmp_path: Path, platform: str = "x86_64") -> Resolution:
    return resolve(
        Target("t", platform, "3.11"), stack, stand_ins, tmp_path / platform, offline=True, timeout=120
    )


def test_a_resolvable_set_reports_its_versions_and_the_stand_ins_it_used(tmp_path: Path) -> None:
    stand_ins = {"a==1.0": _entry("b>=1"), "b==1.5": _entry(), "unused==1.0": _entry()}
    result = _offline(_stack("a==1.0"), stand_ins, tmp_path)
    assert result.resolved, result.conflict
    assert result.versions == {"a": "1.0", "b": "1.5"}
    assert result.stand_ins == ["a==1.0", "b==1.5"]


def test_a_conflict_names_who_asked_for_what(tmp_path: Path) -> None:
    stand_ins = {"a==1.0": _entry("numpy<=1.26.0"), "numpy==2.3.5": _entry(), "numpy==1.26.0": _entry()}
    result = _offline(_stack("a==1.0", "numpy==2.3.5"), stand_ins, tmp_path)
    assert not result.resolved
    assert result.conflict == "The user requested numpy==2.3.5; a 1.0 depends on numpy<=1.26.0"


def test_a_version_that_does_not_exist_is_named(tmp_path: Path) -> None:
    stand_ins = {"tokenizers==0.22.2": _entry(), "tokenizers==0.23.3": _entry()}
    result = _offline(_stack("tokenizers==0.23.0"), stand_ins, tmp_path)
    assert not result.resolved
    assert result.conflict == "no distribution of tokenizers==0.23.0 for this target (found: 0.22.2, 0.23.3)"


def test_dependency_markers_are_evaluated_for_the_target_machine(tmp_path: Path) -> None:
    # pip alone evaluates a dependency's markers for the machine it runs on (x86_64 here).
    stand_ins = {"c==1.0": _entry('armonly==1.0; platform_machine == "aarch64"'), "armonly==1.0": _entry()}
    arm = _offline(_stack("c==1.0"), stand_ins, tmp_path, "aarch64")
    x86 = _offline(_stack("c==1.0"), stand_ins, tmp_path, "x86_64")
    assert set(arm.versions) == {"c", "armonly"}
    assert set(x86.versions) == {"c"}


# --- parsing and reporting -------------------------------------------------------------------

# pip 26.3's output for the first MindSpeed + numpy 2 attempt, as printed here (abridged paths).
PIP_CONFLICT = """\
INFO: pip is looking at multiple versions of mindspeed to determine which version is compatible with other requirements. This could take a while.
ERROR: Cannot install -r requirements.txt (line 11), -r requirements.txt (line 2) and numpy==2.3.5 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested numpy==2.3.5
    numba 0.65.0 depends on numpy<2.5 and >=1.22
    scipy 1.16.3 depends on numpy<2.6 and >=1.25.2
    mindspeed 0.12.1 depends on numpy<=1.26.0

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    numpy

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""

PIP_MISSING = """\
ERROR: Ignored the following versions that require a different python version: 0.17.0 Requires-Python >=3.12
ERROR: Could not find a version that satisfies the requirement antlr4-python3-runtime==4.9.* (from omegaconf) (from versions: 4.11.0, 4.11.1, 4.12.0, 4.13.0, 4.13.1, 4.13.2)
ERROR: No matching distribution found for antlr4-python3-runtime==4.9.* (from omegaconf)
"""


def test_conflict_summary_keeps_the_lines_that_conflict() -> None:
    assert (
        conflict_summary(PIP_CONFLICT)
        == "The user requested numpy==2.3.5; mindspeed 0.12.1 depends on numpy<=1.26.0"
    )


def test_conflict_summary_of_a_missing_distribution() -> None:
    assert conflict_summary(PIP_MISSING) == (
        "no distribution of antlr4-python3-runtime==4.9.* (from omegaconf) for this target "
        "(found: 4.11.0, 4.11.1, 4.12.0, 4.13.0, 4.13.1, 4.13.2)"
    )


def test_conflict_summary_falls_back_to_the_last_error() -> None:
    assert (
        conflict_summary("ERROR: Ignored the following versions\nERROR: something else broke\n")
        == "something else broke"
    )
    assert conflict_summary("") == "pip failed without a message"


def test_versions_from_report_canonicalises_names() -> None:
    report = {
        "install": [
            {"metadata": {"name": "PyYAML", "version": "6.0.4"}},
            {"metadata": {"name": "torch_npu", "version": "2.7.1.post11"}},
        ]
    }
    assert versions_from_report(report) == {"pyyaml": "6.0.4", "torch-npu": "2.7.1.post11"}


def test_table_shows_answers_and_conflicts() -> None:
    ok = Resolution(Target("gpu-trainer", "x86_64", "3.12"), True, None, {"a": "1", "b": "2"}, ["b==2"])
    bad = Resolution(
        Target("npu", "aarch64", "3.11"),
        False,
        "The user requested numpy==2.3.5; mindspeed 0.12.1 depends on numpy<=1.26.0",
    )
    rows = table([ok, bad]).splitlines()
    assert rows[0].split() == [
        "stack",
        "platform",
        "python",
        "resolved",
        "packages",
        "conflict",
        "/",
        "stand-ins",
        "used",
    ]
    assert rows[1].split() == ["gpu-trainer", "x86_64", "3.12", "yes", "2", "b==2"]
    assert rows[2].split()[:5] == ["npu", "aarch64", "3.11", "NO", "-"]
    assert rows[2].endswith("mindspeed 0.12.1 depends on numpy<=1.26.0")


def test_a_partial_run_updates_its_targets_only() -> None:
    old = {"results": [{"stack": "s", "platform": "x86_64", "python": "3.11", "resolved": False, "stand_ins": []},
                       {"stack": "t", "platform": "x86_64", "python": "3.11", "resolved": True, "stand_ins": ["a==1"]}],
           "stand_ins": {"a==1": {"from": "x"}}}  # fmt: skip
    new = {
        "results": [
            {"stack": "s", "platform": "x86_64", "python": "3.11", "resolved": True, "stand_ins": []}
        ],
        "stand_ins": {},
    }
    result = merged(old, new)
    assert [(r["stack"], r["resolved"]) for r in result["results"]] == [("s", True), ("t", True)]
    assert result["stand_ins"] == {"a==1": {"from": "x"}}
