"""The rest of the surface a client touches: stream framing and `stream_options.include_usage` on the
wire, completions' `echo` and prompt forms, chat template options, /v1/tokenize, /v1/detokenize and
/v1/models, each through real Envoy against both engine protocols."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from tests.conformance.calls import ask
from tests.conformance.stacks import EMPTY_THINKING, Gateway, parse_events

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def body(gw: Gateway, api: str, **fields: Any) -> dict[str, Any]:
    prompt = {"messages": [{"role": "user", "content": "Hi."}]} if api == "chat" else {"prompt": "Hi."}
    return {"model": gw.model, **prompt, **fields}


def chunk_model(api: str, event: dict[str, Any]) -> Any:
    """A streamed event checked against the client's model. The legacy `Completion` types a choice's
    finish_reason as never null, yet every chunk before the last carries null (as OpenAI's and vLLM's
    streams do; the client does not validate chunks): it is checked apart, then validated as a string."""
    if api == "chat":
        return ChatCompletionChunk.model_validate(event)
    for choice in event["choices"]:
        assert choice["finish_reason"] in (None, "stop", "length")
    chunk = Completion.model_validate(
        {**event, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in event["choices"]]}
    )
    for validated, choice in zip(chunk.choices, event["choices"], strict=True):
        validated.finish_reason = choice["finish_reason"]
    return chunk


@pytest.mark.parametrize("include_usage", [None, False, True])
def test_stream_ends_with_done_and_has_usage_only_when_asked(
    gateway: Gateway, api: str, include_usage: bool | None
) -> None:
    fields: dict[str, Any] = {"stream": True, "max_tokens": 4, "ignore_eos": True}
    if include_usage is not None:
        fields["stream_options"] = {"include_usage": include_usage}
    events = parse_events(gateway.sse(PATHS[api], body(gateway, api, **fields)))
    chunks = [chunk_model(api, e) for e in events]
    with_usage = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert with_usage == [chunks[-1]] and chunks[-1].choices == []
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 4
        assert usage.total_tokens == usage.prompt_tokens + 4
        chunks = chunks[:-1]
    else:
        assert with_usage == []
        assert all("usage" not in e or e["usage"] is None for e in events)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_echo_puts_the_prompt_before_the_answer(gateway: Gateway, stream: bool) -> None:
    prompt = "Once upon a time"
    plain = ask(gateway, "completions", False, prompt, seed=51, max_tokens=5)
    echoed = ask(gateway, "completions", stream, prompt, seed=51, max_tokens=5, echo=True)
    assert echoed.text == prompt + plain.text
    assert echoed.usage == plain.usage


def test_echo_of_a_token_prompt_is_its_text(gateway: Gateway, stream: bool) -> None:
    ids = gateway.tokenize(prompt="Once upon a time")["tokens"]
    plain = ask(gateway, "completions", False, ids, seed=52, max_tokens=5)
    echoed = ask(gateway, "completions", stream, ids, seed=52, max_tokens=5, echo=True)
    assert echoed.text == gateway.detokenize(ids) + plain.text


@pytest.mark.parametrize("form", ["text", "token ids", "list of one text", "list of one token list"])
def test_completion_prompt_forms_mean_the_same(gateway: Gateway, stream: bool, form: str) -> None:
    text = "The sea at night"
    ids = gateway.tokenize(prompt=text)["tokens"]
    prompt: Any = {
        "text": text,
        "token ids": ids,
        "list of one text": [text],
        "list of one token list": [ids],
    }[form]
    reference = ask(gateway, "completions", False, text, seed=71, max_tokens=6)
    a = ask(gateway, "completions", stream, prompt, seed=71, max_tokens=6)
    assert a.text == reference.text
    assert a.usage is not None and a.usage.prompt_tokens == len(ids)
    assert gateway.spy is not None
    assert list(gateway.spy.request_for(a.id).tokenized.input_ids) == ids


def rendered_prompt(gw: Gateway, **fields: Any) -> tuple[list[int], str]:
    tokens = gw.tokenize(**fields)["tokens"]
    return tokens, gw.detokenize(tokens)


def check_chat_prompt(gw: Gateway, stream: bool, tokens: list[int], **fields: Any) -> None:
    """A chat request with `fields` sends the engine exactly the prompt /v1/tokenize showed."""
    a = ask(gw, "chat", stream, max_tokens=3, **fields)
    assert a.usage is not None and a.usage.prompt_tokens == len(tokens)
    assert gw.spy is not None
    assert list(gw.spy.request_for(a.id).tokenized.input_ids) == tokens


MESSAGES = [{"role": "user", "content": "Write a story."}]


def test_default_chat_prompt_ends_with_the_generation_prompt(gateway: Gateway, stream: bool) -> None:
    tokens, text = rendered_prompt(gateway, messages=MESSAGES)
    assert text.endswith("Write a story.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    check_chat_prompt(gateway, stream, tokens, messages=MESSAGES)


def test_add_generation_prompt_false_leaves_the_assistant_header_out(gateway: Gateway, stream: bool) -> None:
    tokens, text = rendered_prompt(gateway, messages=MESSAGES, add_generation_prompt=False)
    assert text.endswith("Write a story.<|eot_id|>")
    check_chat_prompt(gateway, stream, tokens, messages=MESSAGES, add_generation_prompt=False)


def test_continue_final_message_continues_the_assistant_text(gateway: Gateway, stream: bool) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Once upon a"}]
    options = {"continue_final_message": True, "add_generation_prompt": False}
    tokens, text = rendered_prompt(gateway, messages=messages, **options)
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nOnce upon a")
    check_chat_prompt(gateway, stream, tokens, messages=messages, **options)


def test_chat_template_kwargs_reach_the_template(gateway: Gateway, stream: bool) -> None:
    plain, _ = rendered_prompt(gateway, messages=MESSAGES)
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    tokens, text = rendered_prompt(gateway, messages=MESSAGES, **kwargs)
    assert text.endswith("assistant<|end_header_id|>\n\n" + EMPTY_THINKING)
    assert len(tokens) > len(plain)
    check_chat_prompt(gateway, stream, tokens, messages=MESSAGES, **kwargs)


def test_tokenize_and_detokenize_round_trip(gateway: Gateway) -> None:
    text = "Hello, world: a test of tokens."
    with_special = gateway.tokenize(prompt=text, return_token_strs=True)
    plain = gateway.tokenize(prompt=text, add_special_tokens=False)
    assert with_special["count"] == len(with_special["tokens"]) == len(with_special["token_strs"])
    assert with_special["tokens"][-len(plain["tokens"]) :] == plain["tokens"]
    assert gateway.detokenize(plain["tokens"]) == text
    assert with_special["max_model_len"] == plain["max_model_len"] > 0
    chat = gateway.tokenize(messages=MESSAGES)
    assert chat["count"] == len(chat["tokens"]) > plain["count"]


def test_tokenize_errors_name_their_parameter(gateway: Gateway) -> None:
    status, answer = gateway.post("/v1/tokenize", {"model": "no-such-model", "prompt": "x"})
    assert status == 404 and answer["error"]["param"] == "model"
    status, answer = gateway.post("/v1/detokenize", {"model": gateway.model, "tokens": [10**9]})
    assert status == 400 and answer["error"]["param"] == "tokens"
    status, answer = gateway.post("/v1/detokenize", {"model": gateway.model})
    assert status == 400 and answer["error"]["param"] == "tokens"


def test_models_lists_the_served_model(gateway: Gateway) -> None:
    models = list(gateway.client.models.list())
    assert [m.id for m in models] == [gateway.model]
    model = models[0]
    assert model.object == "model" and model.owned_by and model.created > 0
    # vLLM's extension: the context length, as /v1/tokenize reports it.
    assert model.model_extra is not None
    assert model.model_extra["max_model_len"] == gateway.tokenize(prompt="x")["max_model_len"]
