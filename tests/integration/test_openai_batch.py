"""Batched completions prompts through the real stack: the gateway routes each prompt on its own, makes
the engine calls itself and answers with one `text_completion` (choices indexed prompt * n + choice)."""

from __future__ import annotations

import openai
import pytest

from tests.integration.harness import Stack

PROMPTS = ["Once upon a time", "The sea", "In the mountains there"]
TOKENS = 6


def one(
    client: openai.OpenAI, stack: Stack, prompt: str | list[int], **extra: object
) -> openai.types.Completion:
    return client.completions.create(
        model=stack.model, prompt=prompt, max_tokens=TOKENS, seed=4, extra_body={"ignore_eos": True}, **extra
    )


def test_a_batch_answers_each_prompt_as_its_own_request_would(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    batch = one(client, stack, PROMPTS)
    assert stack.generate_requests() == before + len(PROMPTS)
    alone = [one(client, stack, p) for p in PROMPTS]
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone]
    assert all(c.finish_reason == "length" for c in batch.choices)
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == len(PROMPTS) * TOKENS


def test_a_batch_of_token_lists_with_n_and_logprobs(client: openai.OpenAI, stack: Stack) -> None:
    ids = [[128000, 791, 9581], [128000, 9906]]
    r = one(client, stack, ids, n=2, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        assert "".join(c.logprobs.tokens) == c.text
    assert r.usage.prompt_tokens == 5
    assert r.usage.completion_tokens == 4 * TOKENS
    # Choices 0-1 are the first prompt's samples, 2-3 the second's, as one request each would give.
    for i, prompt in enumerate(ids):
        alone = one(client, stack, prompt, n=2, logprobs=1)
        assert [c.text for c in r.choices[2 * i : 2 * i + 2]] == [c.text for c in alone.choices]


def test_bad_batches_are_refused_before_any_engine(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=stack.model, prompt=PROMPTS, stream=True)
    assert e.value.body["param"] == "stream"
    with pytest.raises(openai.BadRequestError) as e:
        # One prompt too long fails the whole batch, before any engine call.
        client.completions.create(model=stack.model, prompt=["short", "x " * 9000], max_tokens=4)
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=stack.model, prompt=["x"] * 65)
    assert e.value.body["param"] == "prompt"
    assert stack.generate_requests() == before
