"""Logprobs through the real stack with the official client: chat's `content` entries and the legacy
completions lists, streamed and not, and the bad requests refused before any engine."""

from __future__ import annotations

import openai
import pytest

from tests.integration.harness import Stack

MESSAGES = [{"role": "user", "content": "Describe the sea."}]
TOKENS = 10


def chat_kwargs(stack: Stack, **extra: object) -> dict:
    return {
        "model": stack.model,
        "messages": MESSAGES,
        "seed": 7,
        "max_tokens": TOKENS,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"ignore_eos": True},
        **extra,
    }


def check_chat_entries(entries: list, top: int) -> None:
    for entry in entries:
        assert entry.logprob <= 0
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == top
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True), "alternatives come most likely first"
        for alt in entry.top_logprobs:
            assert alt.bytes == list(alt.token.encode())
        # The sampled token's logprob is never above the likeliest alternative's.
        assert entry.logprob <= values[0] + 1e-6


def test_chat_logprobs_cover_every_token_of_the_answer(client: openai.OpenAI, stack: Stack) -> None:
    r = client.chat.completions.create(**chat_kwargs(stack))
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == TOKENS
    assert "".join(e.token for e in content) == r.choices[0].message.content
    check_chat_entries(content, 3)


def test_streamed_chat_logprobs_come_with_their_deltas(client: openai.OpenAI, stack: Stack) -> None:
    whole = client.chat.completions.create(**chat_kwargs(stack))
    streamed = []
    text = ""
    for chunk in client.chat.completions.create(**chat_kwargs(stack, stream=True)):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            streamed.extend(choice.logprobs.content)
    assert text == whole.choices[0].message.content
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in whole.choices[0].logprobs.content
    ]
    check_chat_entries(streamed, 3)


def test_chat_without_logprobs_has_none(client: openai.OpenAI, stack: Stack) -> None:
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(**chat_kwargs(stack, top_logprobs=0))
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_parallel_lists_with_text_offsets(
    client: openai.OpenAI, stack: Stack, stream: bool
) -> None:
    kwargs = {
        "model": stack.model,
        "prompt": "The sea is",
        "seed": 3,
        "max_tokens": TOKENS,
        "logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    if stream:
        text, tokens, token_logprobs, top_logprobs, offsets = "", [], [], [], []
        for chunk in client.completions.create(stream=True, **kwargs):
            choice = chunk.choices[0]
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                token_logprobs += choice.logprobs.token_logprobs
                top_logprobs += choice.logprobs.top_logprobs
                offsets += choice.logprobs.text_offset
    else:
        r = client.completions.create(**kwargs)
        text = r.choices[0].text
        lp = r.choices[0].logprobs
        tokens, token_logprobs, top_logprobs, offsets = (
            lp.tokens,
            lp.token_logprobs,
            lp.top_logprobs,
            lp.text_offset,
        )
    assert len(tokens) == len(token_logprobs) == len(top_logprobs) == len(offsets) == TOKENS
    assert "".join(tokens) == text
    for token, logprob, top, offset in zip(tokens, token_logprobs, top_logprobs, offsets, strict=True):
        assert text[offset : offset + len(token)] == token
        assert top[token] == logprob, "the sampled token is among its alternatives"
        assert 1 <= len(top) <= 3


def test_logprobs_with_n_choices(client: openai.OpenAI, stack: Stack) -> None:
    r = client.chat.completions.create(**chat_kwargs(stack, n=2))
    for choice in r.choices:
        assert "".join(e.token for e in choice.logprobs.content) == choice.message.content
    assert r.usage.completion_tokens == 2 * TOKENS


@pytest.mark.parametrize(
    ("api", "extra", "param"),
    [
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"logprobs": 1, "echo": True}, "echo"),
    ],
)
def test_bad_logprobs_requests_are_refused_with_their_param(
    client: openai.OpenAI, stack: Stack, api: str, extra: dict, param: str
) -> None:
    before = stack.generate_requests()
    with pytest.raises(openai.BadRequestError) as e:
        if api == "chat":
            client.chat.completions.create(model=stack.model, messages=MESSAGES, **extra)
        else:
            client.completions.create(model=stack.model, prompt="x", **extra)
    assert e.value.body["param"] == param
    assert stack.generate_requests() == before
