"""docs/reference/config.md is generated from the schema (tools/gen_config_reference.py) and current.

After a schema change this test fails until ``python tools/gen_config_reference.py`` is rerun and
its output committed."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

from mindspeed_rl.config_cls import GRPOConfig, InertKey
from mindspeed_rl.config_cls.fields import ByEngine, inert_reasons, refusal, torch_inert_reason
from mindspeed_rl.config_cls.megatron_config import MEGATRON_FIELDS, MegatronConfig

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "config.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "tools" / "gen_config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_reference_is_what_the_generator_writes_now() -> None:
    assert REFERENCE.read_text() == _generator().render(), (
        "docs/reference/config.md is stale: run python tools/gen_config_reference.py and commit it"
    )


def test_check_mode_fails_on_a_stale_file_and_passes_on_a_current_one(tmp_path: Path) -> None:
    gen = _generator()
    stale = tmp_path / "config.md"
    stale.write_text(REFERENCE.read_text().replace("**honoured**", "**inert**", 1))
    assert gen.main(["--check", "--out", str(stale)]) == 1
    assert gen.main(["--check", "--out", str(tmp_path / "missing.md")]) == 1
    assert gen.main(["--check", "--out", str(REFERENCE)]) == 0
    fresh = tmp_path / "fresh.md"
    assert gen.main(["--out", str(fresh)]) == 0 and fresh.read_text() == REFERENCE.read_text()


def _section_fields() -> list[dataclasses.Field[Any]]:
    out: list[dataclasses.Field[Any]] = []
    seen: set[type] = set()

    def walk(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if cls is not GRPOConfig:  # GRPOConfig's own fields are the sections and run_dir
                out.append(f)
            for arg in (hints[f.name], *typing.get_args(hints[f.name])):
                for inner in (arg, *typing.get_args(arg)):
                    if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                        walk(inner)

    seen.update((MegatronConfig, InertKey))  # flat keys are MEGATRON_FIELDS; InertKey is no section
    walk(GRPOConfig)
    return out


def test_every_key_is_listed_with_its_status_and_reason() -> None:
    text = REFERENCE.read_text()
    rows: dict[str, str] = {}  # key -> its first row (the Megatron keys come first)
    for line in text.splitlines():
        if line.startswith("| `") and line.count(" | ") >= 4:  # key tables, not the top-level one
            rows.setdefault(line[2:].split(" ")[0].strip("`"), line)
    fields = [*MEGATRON_FIELDS.values(), *_section_fields()]
    assert len(fields) > 400
    for f in fields:
        row = rows.get(f.name)
        assert row is not None, f"{f.name} is missing from the reference"
    for f in MEGATRON_FIELDS.values():  # flat keys: one row each, so the row is this field's
        row = rows[f.name]
        reason = inert_reasons(f)
        if refusal(f) is not None:
            assert "**refused**" in row and str(refusal(f)).replace("|", "\\|") in row
        elif isinstance(reason, ByEngine):
            assert f"torch engine: {reason.torch}" in row and f"megatron engine: {reason.megatron}" in row
        elif reason is not None:
            assert f"**inert**: {reason}" in row
        elif torch_inert_reason(f) is not None:
            assert "**megatron engine only**" in row
        else:
            assert "**honoured**" in row
