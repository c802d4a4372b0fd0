"""Load shedding (the endpoint-picker protocol's 429): with `shed_queue_depth` set, a request that
would only queue deeper on every engine is refused at once with an OpenAI-style 429, never sent to an
engine; once the queue drains, requests are served again."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from load.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

# GetLoads polls: the router learns that the engine runs the first request (so it is not queued).
LOAD_INTERVAL_S = 0.05


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # One engine that runs one sequence at a time, 20 ms per token; shed at one queued request.
    sim = SimOptions(max_num_seqs=1, itl_ms=20.0)
    config = '{"shed_queue_depth": 1}'
    with local_stack(
        FreePorts(), tmp_path, engines=1, sim=sim, routing_config=config, load_interval=LOAD_INTERVAL_S
    ) as s:
        yield s


def _send(stack: Stack, max_tokens: int) -> http.client.HTTPConnection:
    """Send a streamed chat request; its response is read later (a queued stream answers only once its
    first token comes)."""
    body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": max_tokens, "ignore_eos": True}
    return post_json(stack.base_url, "/v1/chat/completions", body, timeout=20)


def test_a_request_that_would_only_queue_is_refused_with_429(stack: Stack) -> None:
    (engine,) = stack.engines.engines
    running = _send(stack, 100).getresponse()  # ~2 s of tokens: the engine's one slot is taken
    assert running.status == 200 and running.read(6) == b"data: "
    time.sleep(LOAD_INTERVAL_S * 6)  # a few polls: the engine reports it running, so nothing queues yet
    queued = _send(stack, 1)  # routed, and waits for the slot
    deadline = time.monotonic() + 5
    while engine.stats.generate_requests < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = _send(stack, 1).getresponse()
    payload = json.loads(refused.read())
    assert refused.status == 429, payload
    assert refused.getheader("content-type") == "application/json"
    assert payload["error"]["type"] == "rate_limit_error"
    assert engine.stats.generate_requests == 2, "a shed request never reaches the engine"
    # The queue drains: served again once the engine's next load report says so.
    running.read()
    assert queued.getresponse().read().endswith(b"data: [DONE]\n\n")
    time.sleep(LOAD_INTERVAL_S * 6)
    after = _send(stack, 1).getresponse()
    assert after.status == 200
    assert after.read().endswith(b"data: [DONE]\n\n")
