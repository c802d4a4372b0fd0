"""Native chat templates render byte-identically to `transformers`' `apply_chat_template` (jinja2).

Each case renders one of the project's templates (tests/templates) through both, from the same model
folder, and compares the text, the token ids, or (for inputs the template refuses) the error.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from extproc._native import Tokenizer

MakeModelDir = Callable[..., Path]


@dataclass
class Case:
    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool | str = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The template raises: compare its message (True) or only that both refuse (False, for the
    # checks `transformers` makes itself, whose wording differs).
    raises: bool | None = None


USER = {"role": "user", "content": "Hello there!"}
SYSTEM_CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]
WHITESPACE = [
    {"role": "system", "content": "  padded system \n"},
    {"role": "user", "content": "\n\nlots\tof\n whitespace  \u3000"},
]
UNICODE = [{"role": "user", "content": "Grüße 👋🏽 日本語 \"quotes\" 'single' \\ <|eot_id|> look-alike\x1f"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": 'City name, e.g. "Paris" or 東京'},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "default": 1, "scale": 0.5, "tiny": 1e-7},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris and in 東京?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {
                        "city": "東京",
                        "unit": "celsius",
                        "days": 3,
                        "hourly": False,
                        "ratio": 0.5,
                    },
                },
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18°C, cloudy"},
    {
        "role": "tool",
        "tool_call_id": "c2",
        "content": {"temp": 21.5, "sky": "clear", "alerts": [], "uv": None},
    },
    {"role": "assistant", "content": "Paris: 18°C. Tokyo: 21.5°C."},
    {"role": "user", "content": "Thanks!"},
]
PARTS = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Describe"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "audio", "format": "mp3"},
            {"type": "text", "text": "briefly."},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
    {"role": "user", "content": "Thanks"},
]
REASONING = [
    {"role": "user", "content": "First question"},
    {
        "role": "assistant",
        "content": "<think>old</think>\n\nFirst answer.",
        "reasoning_content": "old reasoning",
    },
    {"role": "user", "content": "Second question"},
    {"role": "assistant", "content": "Second answer.", "thinking": "\nfresh thoughts\n"},
]
DOCUMENTS = [
    {"title": "Paris", "text": " Paris is the capital of France. \n", "year": 2024, "tags": ["geo", "fr"]},
    {"text": "An untitled document.", "score": 0.75, "draft": True, "owner": None},
]
PYTHON_VALUES = {"flag": True, "nothing": None, "count": 7, "ratio": 0.1, "big": 1e20, "tiny": 1e-7}
COMPAT_CHAT = [
    {"role": "system", "content": "sys"},
    {"role": "assistant", "content": "hi"},
    {
        "role": "user",
        "content": "hello world!",
        "name": "ann",
        "meta": {"b": 1, "a": [1.5, None, "x'y"], "c": True},
    },
]
PARTIAL = [USER, {"role": "assistant", "content": "The capital of France is "}]

CASES: dict[str, list[Case]] = {
    "turns": [
        Case("one user turn", [USER]),
        Case("generation prompt", [USER], add_generation_prompt=True),
        Case("system and turns", SYSTEM_CHAT, add_generation_prompt=True),
        Case("whitespace is trimmed", WHITESPACE),
        Case("unicode and look-alikes", UNICODE, add_generation_prompt=True),
        Case("date from kwargs", [USER], kwargs={"date_string": "26 Jul 2024"}),
        Case("not alternating", [USER, USER], raises=True),
        Case("empty final assistant turn skipped", [USER, {"role": "assistant", "content": ""}]),
        Case("continue final message", PARTIAL, continue_final_message=True),
        Case(
            "continue and generation prompt",
            PARTIAL,
            continue_final_message=True,
            add_generation_prompt=True,
            raises=False,
        ),
    ],
    "tools": [
        Case("tools and calls", TOOL_CHAT, tools=TOOLS, add_generation_prompt=True),
        Case("calls without tools", TOOL_CHAT),
        Case("no tools, plain chat", SYSTEM_CHAT, add_generation_prompt=True),
        Case("empty tool list", [USER], tools=[]),
        Case(
            "continue the assistant",
            [USER, {"role": "assistant", "content": "Calling "}],
            tools=TOOLS,
            continue_final_message="content",
        ),
    ],
    "parts": [
        Case("content parts", PARTS, add_generation_prompt=True),
        Case("string content", SYSTEM_CHAT),
        Case("unknown part type", [{"role": "user", "content": [{"type": "video"}]}], raises=True),
        Case(
            "continue a text part",
            [USER, {"role": "assistant", "content": [{"type": "text", "text": "Well, "}]}],
            continue_final_message=True,
        ),
    ],
    "reasoning": [
        Case("reasoning kept after last user turn", REASONING),
        Case("thinking disabled", [USER], add_generation_prompt=True, kwargs={"enable_thinking": False}),
        Case("thinking enabled", [USER], add_generation_prompt=True, kwargs={"enable_thinking": True}),
        Case("reasoning under 'reasoning'", [USER, {"role": "assistant", "content": "A.", "reasoning": "r"}]),
        Case(
            "continue the answer",
            [USER, {"role": "assistant", "content": "Partial", "reasoning_content": "why"}],
            continue_final_message=True,
        ),
        Case(
            "continue the reasoning",
            [USER, {"role": "assistant", "content": "x", "reasoning_content": "I think "}],
            continue_final_message="reasoning_content",
        ),
    ],
    "documents": [
        Case("documents", [USER], documents=DOCUMENTS, add_generation_prompt=True),
        Case(
            "documents with kwargs",
            [USER],
            documents=DOCUMENTS,
            add_generation_prompt=True,
            kwargs={"citation_mode": "accurate"},
        ),
        Case("no documents", SYSTEM_CHAT),
    ],
    "python_compat": [
        Case("python values", COMPAT_CHAT, kwargs=PYTHON_VALUES),
        Case(
            "python values, other numbers",
            COMPAT_CHAT,
            kwargs={**PYTHON_VALUES, "count": -12, "ratio": 2.5e-5, "flag": False, "big": 123456789.125},
        ),
    ],
}


def hf_apply(tok: PreTrainedTokenizerBase, case: Case, tokenize: bool) -> Any:
    out = tok.apply_chat_template(
        case.messages,
        tools=case.tools,
        documents=case.documents,
        add_generation_prompt=case.add_generation_prompt,
        continue_final_message=case.continue_final_message,
        tokenize=tokenize,
        **case.kwargs,
    )
    return out["input_ids"] if tokenize and not isinstance(out, list) else out


def native_args(case: Case) -> dict[str, Any]:
    return {
        "tools_json": None if case.tools is None else json.dumps(case.tools),
        "documents_json": None if case.documents is None else json.dumps(case.documents),
        "add_generation_prompt": case.add_generation_prompt,
        "continue_final_message": case.continue_final_message,
        "chat_template_kwargs_json": json.dumps(case.kwargs),
    }


def assert_same(native: Tokenizer, hf: PreTrainedTokenizerBase, case: Case) -> None:
    messages = json.dumps(case.messages)
    if case.raises is not None:
        with pytest.raises(Exception) as hf_error:
            hf_apply(hf, case, tokenize=False)
        with pytest.raises(ValueError) as native_error:
            native.render_chat(messages, **native_args(case))
        if case.raises:
            assert str(native_error.value) == str(hf_error.value)
        return
    expected = hf_apply(hf, case, tokenize=False)
    assert native.render_chat(messages, **native_args(case)) == expected
    assert native.chat_ids(messages, **native_args(case)) == hf_apply(hf, case, tokenize=True)


@pytest.fixture(scope="module")
def models(
    make_model_dir: MakeModelDir, template_source: Callable[[str], str]
) -> dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]]:
    loaded = {}
    for name in CASES:
        folder = make_model_dir("llama3", template=template_source(name))
        loaded[name] = (Tokenizer.from_model_dir(folder), AutoTokenizer.from_pretrained(folder))
    return loaded


@pytest.mark.parametrize(
    ("template", "case"),
    [(name, case) for name, cases in CASES.items() for case in cases],
    ids=[f"{name}: {case.name}" for name, cases in CASES.items() for case in cases],
)
def test_render_equals_transformers(
    models: dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]], template: str, case: Case
) -> None:
    native, hf = models[template]
    assert_same(native, hf, case)


DEEPSEEK_CASES = [
    Case("tool calls and outputs", TOOL_CHAT, add_generation_prompt=True),
    Case("plain chat", SYSTEM_CHAT, add_generation_prompt=True),
    Case("unknown role", [{"role": "critic", "content": "x"}], raises=True),
]


@pytest.mark.parametrize("case", DEEPSEEK_CASES, ids=[c.name for c in DEEPSEEK_CASES])
def test_deepseek_template_equals_transformers(
    make_model_dir: MakeModelDir, template_source: Callable[[str], str], case: Case
) -> None:
    folder = make_model_dir("deepseek", config_template=template_source("deepseek"))
    assert_same(Tokenizer.from_model_dir(folder), AutoTokenizer.from_pretrained(folder), case)


# Agent conversations for the model-family templates. Call ids are 9 characters (Mistral refuses others);
# the arguments are JSON strings, as OpenAI clients send them.
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'
AGENT_SYSTEM = {"role": "system", "content": "You are a weather assistant."}
AGENT_USER = {"role": "user", "content": "What's the weather in Paris?"}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


PLAIN = [{"role": "user", "content": "Hello there!"}]
SYSTEM_AND_USER = [AGENT_SYSTEM, AGENT_USER]
TOOL_LOOP = [
    AGENT_SYSTEM,
    AGENT_USER,
    {"role": "assistant", "content": None, "tool_calls": [call("call00001", "get_weather", WEATHER_ARGS)]},
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 18, "sky": "cloudy"}'},
    {"role": "assistant", "content": "It is 18°C and cloudy in Paris."},
    {"role": "user", "content": "And tomorrow in 東京?"},
]
PARALLEL = [
    AGENT_USER,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            call("call00001", "get_weather", WEATHER_ARGS),
            call(
                "call00002", "get_weather", '{"city": "東京", "days": 3, "hourly": false, "tags": ["a", "b"]}'
            ),
            call("call00003", "now", ""),
        ],
    },
    {"role": "tool", "tool_call_id": "call00001", "content": "18°C"},
    {"role": "tool", "tool_call_id": "call00002", "content": "21°C"},
    {"role": "tool", "tool_call_id": "call00003", "content": "12:00"},
]
EARLIER_REASONING = [
    {"role": "user", "content": "Is 7 prime?"},
    {"role": "assistant", "content": "Yes.", "reasoning_content": "7 has no divisors but 1 and 7."},
    {"role": "user", "content": "And 9?"},
    {"role": "assistant", "content": "<think>\n9 = 3 * 3.\n</think>\n\nNo."},
]
TOOL_THEN_REASONING = [
    AGENT_USER,
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should look it up.",
        "tool_calls": [call("call00001", "get_weather", WEATHER_ARGS)],
    },
    {"role": "tool", "tool_call_id": "call00001", "content": "18°C"},
]


def family_cases(*, thinking_kwarg: str | None = None, parallel_raises: bool = False) -> list[Case]:
    """The agent conversations every family template is checked on."""
    cases = [
        Case("plain chat", PLAIN),
        Case("plain chat, generation prompt", PLAIN, add_generation_prompt=True),
        Case("system and tools", SYSTEM_AND_USER, tools=TOOLS, add_generation_prompt=True),
        Case("system, no tools", SYSTEM_AND_USER, add_generation_prompt=True),
        Case("tool loop", TOOL_LOOP, tools=TOOLS),
        Case("tool loop, generation prompt", TOOL_LOOP, tools=TOOLS, add_generation_prompt=True),
        Case("tool loop at the result", TOOL_LOOP[:4], tools=TOOLS, add_generation_prompt=True),
        Case(
            "parallel calls",
            PARALLEL,
            tools=TOOLS,
            add_generation_prompt=True,
            raises=True if parallel_raises else None,
        ),
        Case("reasoning in an earlier turn", EARLIER_REASONING),
        Case("reasoning, generation prompt", EARLIER_REASONING[:3], add_generation_prompt=True),
        Case("reasoning before a call", TOOL_THEN_REASONING, tools=TOOLS, add_generation_prompt=True),
    ]
    if thinking_kwarg:
        for on in (True, False):
            cases += [
                Case(
                    f"{thinking_kwarg}={on}", PLAIN, add_generation_prompt=True, kwargs={thinking_kwarg: on}
                ),
                Case(
                    f"{thinking_kwarg}={on}, tool loop",
                    TOOL_LOOP,
                    tools=TOOLS,
                    add_generation_prompt=True,
                    kwargs={thinking_kwarg: on},
                ),
            ]
    return cases


# family template → (tokenizer, the conversations it is checked on)
FAMILIES: dict[str, tuple[str, list[Case]]] = {
    "hermes_qwen25": ("llama3", family_cases()),
    "qwen3": ("llama3", family_cases(thinking_kwarg="enable_thinking")),
    "qwen3_coder": ("llama3", family_cases()),
    "llama31_json": (
        "llama3",
        [
            *family_cases(parallel_raises=True),
            Case("tools in the system turn", TOOL_LOOP, tools=TOOLS, kwargs={"tools_in_user_message": False}),
        ],
    ),
    "llama4_pythonic": ("llama3", family_cases()),
    "mistral": (
        "llama3",
        [
            *family_cases(),
            Case("not alternating", [*PLAIN, *PLAIN], raises=True),
            Case(
                "short call id",
                [AGENT_USER, {"role": "assistant", "tool_calls": [call("c1", "now", "{}")]}],
                raises=True,
            ),
        ],
    ),
    "deepseek_r1": (
        "deepseek",
        [
            *family_cases(thinking_kwarg="thinking"),
            Case("unknown role", [{"role": "critic", "content": "x"}], raises=True),
        ],
    ),
    "kimi_k2": ("llama3", family_cases()),
    "glm45": ("llama3", family_cases(thinking_kwarg="enable_thinking")),
    "gpt_oss_harmony": (
        "llama3",
        [
            *family_cases(),
            Case("reasoning effort", SYSTEM_AND_USER, tools=TOOLS, kwargs={"reasoning_effort": "high"}),
            Case("tool result without a call", [AGENT_USER, PARALLEL[2]], raises=True),
        ],
    ),
    "nemotron": (
        "llama3",
        [
            *family_cases(thinking_kwarg="enable_thinking"),
            Case(
                "/no_think in the system message",
                [{"role": "system", "content": "/no_think Be brief."}, AGENT_USER],
                add_generation_prompt=True,
            ),
        ],
    ),
}


def vllm_prepared(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to `apply_chat_template`: assistant tool calls' `arguments` JSON
    strings parsed to objects ("" to {}), empty `tool_calls` lists dropped. `transformers` itself passes
    strings on as they are (and templates that `tojson` them would double-encode), so extproc, which parses
    them the same way, is compared with `transformers` given these prepared messages."""
    prepared = copy.deepcopy(messages)
    for message in prepared:
        if message.get("role") != "assistant" or "tool_calls" not in message:
            continue
        if not message["tool_calls"]:
            del message["tool_calls"]
            continue
        for tool_call in message["tool_calls"]:
            arguments = tool_call["function"].get("arguments")
            if isinstance(arguments, str):
                tool_call["function"]["arguments"] = json.loads(arguments) if arguments else {}
            elif arguments is None:
                tool_call["function"]["arguments"] = {}
    return prepared


@pytest.fixture(scope="module")
def family_models(
    make_model_dir: MakeModelDir, template_source: Callable[[str], str]
) -> dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]]:
    loaded = {}
    for name, (tokenizer, _) in FAMILIES.items():
        folder = make_model_dir(tokenizer, template=template_source(name))
        loaded[name] = (Tokenizer.from_model_dir(folder), AutoTokenizer.from_pretrained(folder))
    return loaded


@pytest.mark.parametrize(
    ("family", "case"),
    [(name, case) for name, (_, cases) in FAMILIES.items() for case in cases],
    ids=[f"{name}: {case.name}" for name, (_, cases) in FAMILIES.items() for case in cases],
)
def test_family_template_equals_transformers(
    family_models: dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]], family: str, case: Case
) -> None:
    """extproc given the client's messages (string arguments) renders what transformers renders given the
    vLLM-prepared ones (object arguments)."""
    native, hf = family_models[family]
    messages = json.dumps(case.messages)
    prepared = replace(case, messages=vllm_prepared(case.messages))
    if case.raises is not None:
        with pytest.raises(Exception) as hf_error:
            hf_apply(hf, prepared, tokenize=False)
        with pytest.raises(ValueError) as native_error:
            native.render_chat(messages, **native_args(case))
        assert str(native_error.value) == str(hf_error.value)
        return
    expected = hf_apply(hf, prepared, tokenize=False)
    assert native.render_chat(messages, **native_args(case)) == expected
    assert native.chat_ids(messages, **native_args(case)) == hf_apply(hf, prepared, tokenize=True)


@pytest.mark.parametrize(
    ("family", "rendered_call"),
    [
        ("hermes_qwen25", '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'),
        ("qwen3_coder", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"),
        ("llama31_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'),
        ("llama4_pythonic", '[get_weather(city="Paris", unit="celsius")]'),
        ("mistral", '"arguments": {"city": "Paris", "unit": "celsius"}, "id": "call00001"'),
        ("deepseek_r1", '```json\n{"city": "Paris", "unit": "celsius"}\n```'),
        (
            "kimi_k2",
            '<|tool_call_begin|>call00001<|tool_call_argument_begin|>{"city": "Paris", "unit": "celsius"}',
        ),
        ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"),
        (
            "gpt_oss_harmony",
            '<|channel|>commentary json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>',
        ),
        (
            "nemotron",
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        ),
    ],
)
def test_call_arguments_are_rendered_once(
    family_models: dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]], family: str, rendered_call: str
) -> None:
    """A past call's arguments (a JSON string from the client) reach the prompt as JSON, not as a JSON string
    inside JSON."""
    native, _ = family_models[family]
    prompt = native.render_chat(json.dumps(TOOL_LOOP), tools_json=json.dumps(TOOLS))
    assert rendered_call in prompt
    assert '\\"city\\"' not in prompt


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"city": ', "is not valid JSON"),
        ('["Paris"]', "must encode a JSON object"),
        ("5", "must encode a JSON object"),
    ],
)
def test_invalid_call_arguments_are_refused_naming_them(
    family_models: dict[str, tuple[Tokenizer, PreTrainedTokenizerBase]], arguments: str, why: str
) -> None:
    native, _ = family_models["hermes_qwen25"]
    messages = [
        *TOOL_LOOP[:2],
        {"role": "assistant", "tool_calls": [call("call00001", "get_weather", arguments)]},
    ]
    with pytest.raises(ValueError, match=rf"^messages\[2\]\.tool_calls\[0\]\.function\.arguments {why}"):
        native.render_chat(json.dumps(messages))


def test_default_template_renders_calls_and_tools_as_json(make_model_dir: MakeModelDir) -> None:
    """extproc's own template (for models without one) renders past calls' arguments as JSON objects and
    equals transformers on the agent conversations."""
    source = (
        Path(__file__).parent.parent.parent / "extproc" / "default_model" / "chat_template.jinja"
    ).read_text()
    folder = make_model_dir("llama3", template=source)
    native, hf = Tokenizer.from_model_dir(folder), AutoTokenizer.from_pretrained(folder)
    prompt = native.render_chat(json.dumps(TOOL_LOOP), tools_json=json.dumps(TOOLS))
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
    assert json.dumps(TOOLS[0], ensure_ascii=False) in prompt
    for case in family_cases():
        messages = json.dumps(case.messages)
        expected = hf_apply(hf, replace(case, messages=vllm_prepared(case.messages)), tokenize=False)
        assert native.render_chat(messages, **native_args(case)) == expected, case.name


@pytest.mark.parametrize("layout", ["config list", "template files"])
def test_named_templates_are_picked_as_transformers_picks_them(
    make_model_dir: MakeModelDir, template_source: Callable[[str], str], layout: str
) -> None:
    default, tool_use = template_source("turns"), template_source("tools")
    if layout == "config list":
        named = [{"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]
        folder = make_model_dir("llama3", config_template=named)
    else:
        folder = make_model_dir("llama3", template=default, extra_templates={"tool_use": tool_use})
    native, hf = Tokenizer.from_model_dir(folder), AutoTokenizer.from_pretrained(folder)
    with_tools = Case("with tools", TOOL_CHAT, tools=TOOLS, add_generation_prompt=True)
    assert_same(native, hf, with_tools)
    assert "You may call these functions" in native.render_chat(
        json.dumps(TOOL_CHAT), tools_json=json.dumps(TOOLS)
    )
    assert_same(native, hf, Case("without tools", SYSTEM_CHAT, add_generation_prompt=True))
    assert native.render_chat(json.dumps(SYSTEM_CHAT), template_name="tool_use").startswith(
        "<|begin_of_text|><|system|>"
    )
