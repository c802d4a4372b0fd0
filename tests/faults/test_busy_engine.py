"""One of two engines answers RESOURCE_EXHAUSTED (issue 15: 17-19 of 20 concurrent requests became
429s). Envoy retries the refusal on the other engine (`resource-exhausted` in the engine route's
retry_on, within the retry budget), and extproc's router avoids the busy engine for a while, so every
request is served; once the engine has room again it serves again."""

from __future__ import annotations

from tests.faults.clients import chat, concurrently, tally
from tests.integration.harness import Stack


def test_a_busy_engine_leaves_the_requests_to_the_other(stack: Stack) -> None:
    busy, healthy = stack.engines.engines
    busy.faults.set(fail_code="RESOURCE_EXHAUSTED", fail_message="KV cache full")

    # Routed within milliseconds, before any refusal came back: about half go to the busy engine first.
    first = concurrently(20, lambda i: chat(stack, stream=i % 2 == 0, text=f"first {i}"))
    assert tally(first) == {"200": 20}, tally(first)
    refused = busy.stats.generate_requests
    assert refused > 0, "no request was routed to the busy engine: the retry was not exercised"

    # Later waves too (the router's probes of the busy engine are retried the same way).
    second = concurrently(20, lambda i: chat(stack, stream=i % 2 == 1, text=f"second {i}"))
    assert tally(second) == {"200": 20}, tally(second)

    # Busy is not dead: once it has room, its probe succeeds and it serves again.
    busy.faults.clear()
    served_before = busy.stats.completed
    for i in range(60):
        assert chat(stack, stream=False, text=f"after {i}").ok
        if busy.stats.completed > served_before:
            break
    assert busy.stats.completed > served_before, "the recovered engine was never picked again"
    assert healthy.stats.completed >= 40
