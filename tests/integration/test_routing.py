"""Cache-affinity routing through the real stack: the engines' KV events feed the router, so requests
sharing a long prefix land on the engine that holds it, and the hit shows as cached tokens."""

from __future__ import annotations

import time
from pathlib import Path

import openai

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack

# ~700 tokens of shared system prompt: dozens of 16-token blocks on whichever engine serves it first.
SYSTEM = "You are a meticulous assistant. " + " ".join(
    f"Rule {i}: answer precisely and cite item {i}." for i in range(60)
)


def ask(client: openai.OpenAI, stack: Stack, question: str) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=stack.model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
    )


def counts(stack: Stack) -> list[int]:
    return [e.stats.generate_requests for e in stack.engines.engines]


def test_shared_prefix_follows_the_engine_that_holds_it(stack: Stack) -> None:
    client = stack.openai()
    before = counts(stack)
    first = ask(client, stack, "Question zero?")
    holder = next(i for i, (a, b) in enumerate(zip(counts(stack), before, strict=True)) if a > b)
    assert first.usage.prompt_tokens > 600
    time.sleep(0.5)  # the engine's Stored events reach the router on its KV-event stream

    replies = []
    for i in range(1, 7):
        before = counts(stack)
        replies.append(ask(client, stack, f"Question {i}?"))
        landed = [a - b for a, b in zip(counts(stack), before, strict=True)]
        assert landed[holder] == 1, f"request {i} went to engine {landed.index(1)}, not the prefix holder"
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in replies]
    # The shared system prompt is served from the holder's prefix cache: whole blocks of it.
    assert all(c >= 600 for c in cached), cached


def test_round_robin_ignores_the_prefix(tmp_path: Path) -> None:
    # The control: without cache affinity the same requests alternate between the engines.
    with local_stack(FreePorts(), tmp_path, routing_policy="round_robin") as rr:
        client = rr.openai()
        for i in range(6):
            ask(client, rr, f"Question {i}?")
        assert counts(rr) == [3, 3]
