"""`n` choices through the real stack (Envoy, the native gateway, simulated vLLM engines), with the
official client: every choice under its own index, streamed and not, usage over all of them."""

from __future__ import annotations

import openai
import pytest

from tests.integration.harness import Stack

MESSAGES = [{"role": "user", "content": "Write three different openings for a story."}]
TOKENS = 12


def chat_kwargs(stack: Stack, **extra: object) -> dict:
    # ignore_eos: every choice runs to max_tokens, so usage is known exactly.
    return {
        "model": stack.model,
        "messages": MESSAGES,
        "n": 3,
        "seed": 42,
        "max_tokens": TOKENS,
        "extra_body": {"ignore_eos": True},
        **extra,
    }


def test_n_chat_choices_are_distinct_and_usage_sums_them(client: openai.OpenAI, stack: Stack) -> None:
    r = client.chat.completions.create(**chat_kwargs(stack))
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert all(texts), texts
    assert len(set(texts)) == 3, "three samples of one prompt, not one answer three times"
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 3 * TOKENS
    assert r.usage.total_tokens == r.usage.prompt_tokens + 3 * TOKENS


def test_streamed_n_chat_choices_match_the_non_streamed_ones(client: openai.OpenAI, stack: Stack) -> None:
    whole = client.chat.completions.create(**chat_kwargs(stack))
    chunks = list(
        client.chat.completions.create(
            **chat_kwargs(stack, stream=True, stream_options={"include_usage": True})
        )
    )
    texts = ["", "", ""]
    finishes: dict[int, str] = {}
    roles: set[int] = set()
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1, "each streamed chunk carries one choice"
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.delta.role:
            roles.add(choice.index)
        if choice.finish_reason:
            assert choice.index not in finishes
            finishes[choice.index] = choice.finish_reason
    assert roles == {0, 1, 2}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert texts == [c.message.content for c in whole.choices]
    usage = chunks[-1]
    assert usage.choices == []
    assert usage.usage.completion_tokens == 3 * TOKENS


@pytest.mark.parametrize("stream", [False, True])
def test_n_completion_choices(client: openai.OpenAI, stack: Stack, stream: bool) -> None:
    kwargs = {
        "model": stack.model,
        "prompt": "Once upon a time",
        "n": 2,
        "seed": 9,
        "max_tokens": TOKENS,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == 2 * TOKENS
    if stream:
        texts = ["", ""]
        for chunk in client.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        assert texts == [c.text for c in whole.choices]


def test_n_with_greedy_sampling_is_refused_before_any_engine(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack.model, messages=MESSAGES, n=2, temperature=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack.model, messages=MESSAGES, n=0)
    assert e.value.body["param"] == "n"
    assert stack.generate_requests() == before
