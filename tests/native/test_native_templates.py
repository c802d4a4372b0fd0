"""Native chat templates render byte-identically to `transformers`' `apply_chat_template` (jinja2).

Each case renders one of the project's templates (tests/templates) through both, from the same model
folder, and compares the text, the token ids, or (for inputs the template refuses) the error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
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
