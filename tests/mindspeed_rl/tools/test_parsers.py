"""The hermes tool-call parser on well-formed, malformed and multiple calls."""

from __future__ import annotations

import pytest

from mindspeed_rl.tools.parsers import CallError, ToolCall, get_parser, parser_names, register_parser


def parse(text: str) -> list[ToolCall | CallError]:
    return get_parser("hermes").parse(text)


def test_one_well_formed_call() -> None:
    text = 'Let me compute.\n<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}</tool_call>'
    assert parse(text) == [ToolCall("code_interpreter", {"code": "print(6*7)"})]


def test_no_call_is_an_empty_list() -> None:
    assert parse("The answer is 42.") == []


def test_several_calls_in_order() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> then '
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    # The second call's arguments come JSON-encoded as a string (OpenAI wire format): decoded.
    assert parse(text) == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": 2})]


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        ("{not json}", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "a", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "a", "arguments": "nope"}', "string that is not a JSON object"),
    ],
)
def test_malformed_call_becomes_an_error_not_an_exception(body: str, phrase: str) -> None:
    (result,) = parse(f"<tool_call>{body}</tool_call>")
    assert isinstance(result, CallError)
    assert phrase in result.message


def test_good_and_bad_calls_are_both_reported() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>oops</tool_call>'
    good, bad = parse(text)
    assert good == ToolCall("a", {})
    assert isinstance(bad, CallError)


def test_unterminated_call_is_reported() -> None:
    results = parse('<tool_call>{"name": "a", "arguments": {}}')
    assert len(results) == 1 and isinstance(results[0], CallError)
    assert "unterminated" in results[0].message


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hermes"):
        get_parser("nope")


def test_registering_a_name_twice_is_refused() -> None:
    assert "hermes" in parser_names()
    with pytest.raises(ValueError, match="registered twice"):
        register_parser("hermes")(type("Other", (), {}))


def test_a_parser_by_dotted_path_and_a_bad_path_named() -> None:
    parser = get_parser("mindspeed_rl.tools.fault_tools.CallEveryTurn")
    assert parser.parse("anything") == [ToolCall(name="python", arguments={"code": "print(6 * 7)"})]
    with pytest.raises(ValueError, match="cannot import it"):
        get_parser("mindspeed_rl.tools.no_such_module.Parser")
    with pytest.raises(ValueError, match="is not a tool parser"):
        get_parser("mindspeed_rl.tools.agent_loop.ObservationFormat")
    with pytest.raises(ValueError, match="built without arguments"):
        get_parser("mindspeed_rl.tools.agent_loop.AgentSettings")
