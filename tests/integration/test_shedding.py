"""Load shedding (the endpoint-picker protocol's 429) by priority: with `shed_queue_depth` set, a request
whose objective (the `x-gateway-inference-objective` header) has a negative priority and that would only
queue deeper on every engine is refused at once with an OpenAI-style 429, never sent to an engine;
requests of priority 0 and above queue at the engine instead. Once the queue drains, sheddable requests
are served again."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc import contracts
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

# GetLoads polls: the router learns that the engine runs the first request (so it is not queued).
LOAD_INTERVAL_S = 0.05
OBJECTIVE = contracts.OBJECTIVE_HEADER


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # One engine that runs one sequence at a time, 20 ms per token; shed batch traffic at one queued request.
    sim = SimOptions(max_num_seqs=1, itl_ms=20.0)
    config = json.dumps({"shed_queue_depth": 1, "objectives": {"batch": -1, "chat": 10}})
    with local_stack(
        FreePorts(), tmp_path, engines=1, sim=sim, routing_config=config, load_interval=LOAD_INTERVAL_S
    ) as s:
        yield s


def _send(stack: Stack, max_tokens: int, objective: str | None = None) -> http.client.HTTPConnection:
    """Send a streamed chat request (of `objective`, when given); its response is read later (a queued
    stream answers only once its first token comes)."""
    body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": max_tokens, "ignore_eos": True}
    headers = {OBJECTIVE: objective} if objective else None
    return post_json(stack.base_url, "/v1/chat/completions", body, timeout=20, headers=headers)


def _assert_shed(stack: Stack) -> None:
    refused = _send(stack, 1, "batch").getresponse()
    payload = json.loads(refused.read())
    assert refused.status == 429, payload
    assert refused.getheader("content-type") == "application/json"
    assert payload["error"]["type"] == "rate_limit_error"
    assert "objective 'batch' (priority -1)" in payload["error"]["message"]


def _assert_served(conn: http.client.HTTPConnection) -> None:
    response = conn.getresponse()
    assert response.status == 200
    assert response.read().endswith(b"data: [DONE]\n\n")


def test_only_sheddable_requests_are_refused_with_429_when_every_queue_is_full(stack: Stack) -> None:
    (engine,) = stack.engines.engines
    running = _send(stack, 100).getresponse()  # ~2 s of tokens: the engine's one slot is taken
    assert running.status == 200 and running.read(6) == b"data: "
    time.sleep(LOAD_INTERVAL_S * 6)  # a few polls: the engine reports it running, so nothing queues yet
    queued = _send(stack, 1, "batch")  # below the depth a sheddable request is routed, and waits for the slot
    assert wait_for(lambda: engine.stats.generate_requests == 2, timeout=5)
    _assert_shed(stack)
    assert engine.stats.generate_requests == 2, "a shed request never reaches the engine"
    # Priority 0 (no header) and 10 (chat) are never shed: they queue at the engine under the same saturation.
    unnamed = _send(stack, 1)
    chat = _send(stack, 1, "chat")
    assert wait_for(lambda: engine.stats.generate_requests == 4, timeout=5)
    _assert_shed(stack)
    assert engine.stats.generate_requests == 4
    running.read()
    for conn in (queued, unnamed, chat):
        _assert_served(conn)
    # The queue drains: batch requests are served again once the engine's next load report says so.
    time.sleep(LOAD_INTERVAL_S * 6)
    _assert_served(_send(stack, 1, "batch"))
    assert engine.stats.generate_requests == 5
