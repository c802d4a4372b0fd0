"""Agent requests (issue 12), request side: invalid `tools`, `tool_choice`, `response_format`,
`structured_outputs` and `guided_*` are refused with a 400 naming the parameter and a string `code`
before any engine call, as are fields the gateway does not implement; a valid constraint reaches the
engine in its protocol's own `SamplingParams.constraint` field (the engine spy shows what was sent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conformance.stacks import Gateway

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def tool_with_unit(name: str, unit: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"u": {"$ref": "#/$defs/Unit"}}, "$defs": {"Unit": unit}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# (what is wrong, the request's extra fields, the `param` and `code` of the 400)
INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    ("tools not a list", {"tools": {"a": 1}}, "tools", "invalid_type"),
    ("tools empty", {"tools": []}, "tools", "invalid_value"),
    (
        "tool without type",
        {"tools": [{"function": {"name": "f"}}]},
        "tools[0].type",
        "missing_required_parameter",
    ),
    (
        "tool of another type",
        {"tools": [{"type": "code_interpreter", "function": {"name": "f"}}]},
        "tools[0].type",
        "invalid_value",
    ),
    (
        "tool without function",
        {"tools": [{"type": "function"}]},
        "tools[0].function",
        "missing_required_parameter",
    ),
    (
        "tool without a name",
        {"tools": [{"type": "function", "function": {"description": "d"}}]},
        "tools[0].function.name",
        "missing_required_parameter",
    ),
    (
        "tool name with a space",
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        "tools[0].function.name",
        "invalid_value",
    ),
    (
        "tool name of 65 characters",
        {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
        "tools[0].function.name",
        "invalid_value",
    ),
    ("tool names repeated", {"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "invalid_value"),
    (
        "parameters not an object",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
        "tools[0].function.parameters",
        "invalid_type",
    ),
    (
        "parameters of an unknown type",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "dict"}}}]},
        "tools[0].function.parameters.type",
        "invalid_value",
    ),
    (
        "conflicting $defs under a forced choice",
        {
            "tools": [tool_with_unit("a", {"enum": ["C"]}), tool_with_unit("b", {"enum": ["F"]})],
            "tool_choice": "required",
        },
        "tools[1].function.parameters.$defs.Unit",
        "conflicting_parameters",
    ),
    ("tool_choice unknown word", {"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "invalid_value"),
    (
        "tool_choice required without tools",
        {"tool_choice": "required"},
        "tool_choice",
        "missing_required_parameter",
    ),
    (
        "tool_choice named without tools",
        {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "tool_choice",
        "missing_required_parameter",
    ),
    (
        "tool_choice naming a function not in tools",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        "tool_choice.function.name",
        "invalid_value",
    ),
    (
        "tool_choice object without function",
        {"tools": [WEATHER], "tool_choice": {"type": "function"}},
        "tool_choice.function",
        "missing_required_parameter",
    ),
    (
        "parallel_tool_calls not a boolean",
        {"parallel_tool_calls": "yes"},
        "parallel_tool_calls",
        "invalid_type",
    ),
    ("response_format a string", {"response_format": "json"}, "response_format", "invalid_type"),
    (
        "response_format of an unknown type",
        {"response_format": {"type": "xml"}},
        "response_format.type",
        "invalid_value",
    ),
    (
        "json_schema without json_schema",
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "missing_required_parameter",
    ),
    (
        "json_schema without a name",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
        "response_format.json_schema.name",
        "missing_required_parameter",
    ),
    (
        "json_schema without a schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "person"}}},
        "response_format.json_schema.schema",
        "missing_required_parameter",
    ),
    (
        "json_schema strict not a boolean",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": PERSON, "strict": 1},
            }
        },
        "response_format.json_schema.strict",
        "invalid_type",
    ),
    (
        "structured_outputs with no kind",
        {"structured_outputs": {}},
        "structured_outputs",
        "missing_required_parameter",
    ),
    (
        "structured_outputs with two kinds",
        {"structured_outputs": {"json": PERSON, "regex": "[a-z]+"}},
        "structured_outputs.regex",
        "conflicting_parameters",
    ),
    ("guided_choice empty", {"guided_choice": []}, "guided_choice", "invalid_value"),
    ("guided_json not JSON", {"guided_json": "{nope"}, "guided_json", "invalid_value"),
    (
        "two guided constraints",
        {"guided_regex": "a+", "guided_choice": ["a"]},
        "guided_choice",
        "conflicting_parameters",
    ),
    (
        "response_format with a guided constraint",
        {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
        "guided_regex",
        "conflicting_parameters",
    ),
    (
        "forced tool choice with response_format",
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "conflicting_parameters",
    ),
    (
        "named tool choice with guided_json",
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "guided_json": PERSON,
        },
        "guided_json",
        "conflicting_parameters",
    ),
    # Fields that would change the answer and are not implemented.
    ("legacy functions", {"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ("legacy function_call", {"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ("audio output", {"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    (
        "predicted output",
        {"prediction": {"type": "content", "content": "x"}},
        "prediction",
        "unsupported_parameter",
    ),
    ("web search", {"web_search_options": {}}, "web_search_options", "unsupported_parameter"),
    ("best_of above n", {"best_of": 2}, "best_of", "unsupported_value"),
    ("beam search", {"use_beam_search": True}, "use_beam_search", "unsupported_parameter"),
    ("regex with an unclosed group", {"guided_regex": "(ab|c"}, "guided_regex", "invalid_value"),
    (
        "regex with nothing to repeat",
        {"structured_outputs": {"regex": "*abc"}},
        "structured_outputs.regex",
        "invalid_value",
    ),
    ("documents not a list", {"documents": {"text": "x"}}, "documents", "invalid_type"),
]
COMPLETIONS_INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    ("suffix", {"suffix": " the end."}, "suffix", "unsupported_parameter"),
    ("best_of other than n", {"best_of": 3, "n": 2}, "best_of", "unsupported_value"),
    ("guided_regex empty", {"guided_regex": ""}, "guided_regex", "invalid_value"),
    (
        "response_format with guided_choice",
        {"response_format": {"type": "json_object"}, "guided_choice": ["a"]},
        "guided_choice",
        "conflicting_parameters",
    ),
]


def body(gw: Gateway, api: str, stream: bool, extra: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"model": gw.model, "max_tokens": 4, "stream": stream}
    if api == "chat":
        base["messages"] = [{"role": "user", "content": "What is the weather in Paris?"}]
    else:
        base["prompt"] = "The weather in Paris is"
    return {**base, **extra}


def path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


CASES = [("chat", *c) for c in INVALID] + [("completions", *c) for c in COMPLETIONS_INVALID]


@pytest.mark.parametrize(
    ("api", "what", "extra", "param", "code"), CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES]
)
def test_invalid_agent_request_is_a_400_with_param_and_code_and_no_engine_call(
    gateway: Gateway, stream: bool, api: str, what: str, extra: dict[str, Any], param: str, code: str
) -> None:
    assert gateway.generate_requests is not None
    before = gateway.generate_requests()
    status, answer = gateway.post(path(api), body(gateway, api, stream, extra))
    assert status == 400, (what, answer)
    error = answer["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    assert error["message"]
    assert gateway.generate_requests() == before, "the engine never sees a refused request"


def constraint_sent(gw: Gateway, response_id: str) -> tuple[str | None, Any]:
    """Which member of the engine request's `SamplingParams.constraint` oneof was set, and its value."""
    assert gw.spy is not None
    params = gw.spy.request_for(response_id).sampling_params
    kind = params.WhichOneof("constraint")
    return kind, (getattr(params, kind) if kind else None)


def send(gw: Gateway, api: str, extra: dict[str, Any]) -> str:
    status, answer = gw.post(path(api), body(gw, api, False, extra))
    assert status == 200, answer
    return answer["id"]


def send_refused_by_engine(gw: Gateway, api: str, extra: dict[str, Any]) -> Any:
    """A request the engine itself refuses (the simulator honours no grammars): its error reaches the
    client as a 400, and the engine request it refused is the one the spy recorded meanwhile."""
    assert gw.spy is not None
    before = set(gw.spy.requests)
    status, answer = gw.post(path(api), body(gw, api, False, extra))
    assert status == 400 and "not supported by the simulator" in answer["error"]["message"], answer
    (new,) = set(gw.spy.requests) - before
    return gw.spy.requests[new]


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_each_constraint_reaches_the_engine_in_its_protocol_field(gateway: Gateway, api: str) -> None:
    vllm = gateway.protocol == "vllm"
    schema_field = "json_schema"
    cases: list[tuple[dict[str, Any], str, Any]] = [
        ({"response_format": {"type": "json_object"}}, schema_field, {"type": "object"}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
            schema_field,
            PERSON,
        ),
        ({"structured_outputs": {"json": PERSON}}, schema_field, PERSON),
        ({"guided_json": json.dumps(PERSON)}, schema_field, PERSON),
        ({"guided_regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
        (
            {"structured_outputs": {"grammar": 'root ::= "yes"'}},
            "grammar" if vllm else "ebnf_grammar",
            'root ::= "yes"',
        ),
        # SGLang's protocol has no choice: the gateway sends the regex of exactly those choices.
        ({"guided_choice": ["sunny", "rain (light)"]}, "choice" if vllm else "regex", None),
        ({"response_format": {"type": "text"}}, None, None),
    ]
    for extra, field, value in cases:
        if "grammar" in extra.get("structured_outputs", {}):
            params = send_refused_by_engine(gateway, api, extra).sampling_params
            kind = params.WhichOneof("constraint")
            sent = getattr(params, kind) if kind else None
        else:
            kind, sent = constraint_sent(gateway, send(gateway, api, extra))
        assert kind == field, (extra, kind)
        if field == schema_field:
            assert json.loads(sent) == value, extra
        elif field == "choice":
            assert list(sent.choices) == ["sunny", "rain (light)"]
        elif "guided_choice" in extra:
            assert sent == r"(sunny|rain \(light\))"
        elif field is not None:
            assert sent == value, extra


def test_a_forced_tool_choice_reaches_the_engine_as_the_schema_of_the_calls(gateway: Gateway) -> None:
    named = {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    kind, sent = constraint_sent(gateway, send(gateway, "chat", named))
    assert kind == "json_schema"
    assert json.loads(sent) == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": "get_weather"},
            "parameters": WEATHER["function"]["parameters"],
        },
        "required": ["name", "parameters"],
    }
    required = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
    kind, sent = constraint_sent(gateway, send(gateway, "chat", required))
    schema = json.loads(sent)
    assert kind == "json_schema" and schema["type"] == "array"
    assert (schema["minItems"], schema["maxItems"]) == (1, 1)
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    # tool_choice auto leaves the output free: the response side parses calls out of the text.
    kind, _ = constraint_sent(gateway, send(gateway, "chat", {"tools": [WEATHER]}))
    assert kind is None
