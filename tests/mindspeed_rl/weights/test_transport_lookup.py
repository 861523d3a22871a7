"""``weights/transports``: one module per transport, looked up by name in one place, the name
carried typed from the schema."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import get_args

import pytest

from mindspeed_rl.config_cls.async_config import DEFAULT_WEIGHT_TRANSPORT, AsyncConfig, WeightTransport
from mindspeed_rl.plan.sections import AsyncSpec
from mindspeed_rl.weights.transports import transport_for
from mindspeed_rl.workers.gu_spec import GuSpec

PACKAGE = Path(__file__).resolve().parents[3] / "mindspeed_rl"


@pytest.mark.parametrize("name", get_args(WeightTransport))
def test_every_schema_name_has_its_module_and_answers_to_it(name: str) -> None:
    transport = transport_for(name)
    assert transport.name == name
    assert (PACKAGE / "weights" / "transports" / f"{name}.py").is_file()
    assert transport_for(name) is transport, "looked up once: the same object each time"


def test_the_facts_callers_ask_instead_of_names() -> None:
    facts = {
        n: (t.needs_shared_folder, t.opens_channels, t.needs_one_torch)
        for n in get_args(WeightTransport)
        for t in [transport_for(n)]
    }
    assert facts == {
        "shared_fs": (True, False, False),
        "object_store": (False, False, False),
        "collective": (False, True, True),
    }


def test_an_unknown_name_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ValueError, match="async_config.weight_transport='nfs' is unknown; use one of shared_fs"
    ):
        transport_for("nfs")


def test_the_key_travels_typed_with_one_default() -> None:
    for cls in (AsyncConfig, AsyncSpec, GuSpec):
        # Postponed annotations: the field's type is the alias' name, resolved in its module.
        (field,) = [f for f in dataclasses.fields(cls) if f.name == "weight_transport"]
        assert field.type in ("WeightTransport", WeightTransport), cls.__name__
        assert sys.modules[cls.__module__].WeightTransport is WeightTransport, cls.__name__
    assert AsyncConfig().weight_transport == DEFAULT_WEIGHT_TRANSPORT


def test_no_name_comparison_outside_the_lookup() -> None:
    """A transport's name compared as a string (``== "collective"``) outside weights/transports is
    the branching the protocol replaced."""
    names = get_args(WeightTransport)
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "transports" in path.parts:
            continue
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            for name in names:
                for op in ("==", "!="):
                    if f'{op} "{name}"' in line or f"{op} '{name}'" in line:
                        found.append(f"{path.relative_to(PACKAGE)}:{line_no}: {line.strip()}")
    assert found == []
