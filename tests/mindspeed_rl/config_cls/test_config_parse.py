"""The typed parser: types, unknown keys, immutability, and a doc on every schema field."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

import pytest

from mindspeed_rl.config_cls import GRPOConfig, InertKey, MegatronConfig
from mindspeed_rl.config_cls.fields import field_doc, opt, section
from mindspeed_rl.config_cls.megatron_config import MEGATRON_KEY_GROUP
from mindspeed_rl.config_cls.parse import ConfigError, Problems, parse_dataclass, unknown_key_message


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inner:
    size: int = opt(1, "a size")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Section:
    flag: bool = opt(False, "a flag")
    count: int = opt(0, "a count")
    rate: float = opt(0.5, "a rate")
    name: str | None = opt(None, "a name")
    mode: Literal["a", "b"] = opt("a", "a mode")
    names: tuple[str, ...] = opt((), "names")
    inner: _Inner = section(_Inner, "nested")


def _parse(raw: object) -> tuple[_Section, list[str]]:
    problems = Problems()
    return parse_dataclass(_Section, raw, "sec", problems), problems.messages


def test_values_are_converted_to_declared_types() -> None:
    parsed, problems = _parse(
        {
            "flag": True,
            "count": 2e6,
            "rate": 3,
            "name": "x",
            "mode": "b",
            "names": ["p", "q"],
            "inner": {"size": 4},
        }
    )
    assert problems == []
    assert parsed == _Section(
        flag=True, count=2_000_000, rate=3.0, name="x", mode="b", names=("p", "q"), inner=_Inner(size=4)
    )
    assert isinstance(parsed.count, int) and isinstance(parsed.rate, float)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"flag": 1}, "sec.flag: expected true or false, got int 1"),
        ({"count": True}, "sec.count: expected an integer, got bool True"),
        ({"count": 2.5}, "sec.count: expected an integer, got float 2.5"),
        ({"rate": "fast"}, "sec.rate: expected a number, got str 'fast'"),
        ({"name": 3}, "sec.name: expected a string, got int 3 (quote it in YAML)"),
        ({"mode": "c"}, "sec.mode: expected one of 'a', 'b', got 'c'"),
        ({"names": "p"}, "sec.names: expected a list, got str 'p'"),
        ({"inner": 5}, "sec.inner: expected a mapping, got int 5"),
        ({"inner": {"size": "big"}}, "sec.inner.size: expected an integer, got str 'big'"),
    ],
)
def test_wrong_types_are_reported_with_their_key(raw: dict[str, object], expected: str) -> None:
    _, problems = _parse(raw)
    assert problems == [expected]


def test_unknown_keys_name_the_nearest_valid_key_and_all_problems_are_collected() -> None:
    _, problems = _parse({"cont": 1, "rate": "x", "inner": {"sise": 2}, "zzzzzz": 0})
    assert "sec: unknown key 'cont'; did you mean 'count'?" in problems[0]
    assert "sec.inner: unknown key 'sise'; did you mean 'size'?" in " ".join(problems)
    assert any(p.startswith("sec: unknown key 'zzzzzz' (nearest valid keys:") for p in problems)
    assert len(problems) == 4


def test_problems_raise_one_value_error_listing_each() -> None:
    problems = Problems()
    problems.add("a.b", "bad")
    problems.add("a.b", "bad")  # shared layers are parsed once per role: reported once
    problems.add("c", "worse")
    with pytest.raises(ValueError, match=r"\(2 problem\(s\)\):\n  - a.b: bad\n  - c: worse") as info:
        problems.raise_if_any()
    assert isinstance(info.value, ConfigError)


def test_unknown_key_message_without_close_match_lists_nearest() -> None:
    message = unknown_key_message("qqq", ["alpha", "beta", "gamma", "delta"])
    assert message.startswith("unknown key 'qqq' (nearest valid keys: ")


def test_parsed_objects_are_frozen() -> None:
    parsed, _ = _parse({"count": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.count = 2  # type: ignore[misc]


def _schema_classes() -> list[type]:
    seen: list[type] = []
    todo: list[type] = [GRPOConfig, MegatronConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for candidate in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
                    todo.append(candidate)
    return seen


def test_every_user_facing_field_has_a_doc_and_classes_are_slotted_keyword_only() -> None:
    classes = _schema_classes()
    assert len(classes) >= 15
    for cls in classes:
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        assert "__slots__" in cls.__dict__, cls
        assert all(f.kw_only for f in dataclasses.fields(cls)), cls
        if cls in (GRPOConfig, MegatronConfig, InertKey):
            continue  # composites and report records, not user-facing keys
        missing = [f.name for f in dataclasses.fields(cls) if not field_doc(f)]
        assert missing == [], f"{cls.__name__} fields without a doc: {missing}"


def test_a_field_is_inert_everywhere_or_on_the_torch_engine_not_both() -> None:
    with pytest.raises(TypeError, match="not both"):
        opt(1, "a size", inert="no engine reads it", inert_on_torch="only megatron reads it")


def test_flat_megatron_keys_are_unique_across_groups() -> None:
    assert {"lr", "num_layers", "global_batch_size", "tensor_model_parallel_size", "use_flash_attn"} <= set(
        MEGATRON_KEY_GROUP
    )
    assert MEGATRON_KEY_GROUP["lr"] == "optimizer"
