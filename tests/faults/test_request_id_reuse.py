"""Issue 15, "client ids become engine ids": a second client reusing a victim's `x-request-id` and hanging up
cut the victim's stream (engines abort by id). Engine request ids are now extproc's own, unique per engine
request; the client's id is still echoed to it and kept in logs and summaries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.faults.sse import read_events
from tests.integration.harness import Stack, local_stack, post_json, wait_for

VICTIM_TOKENS = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # One engine, so both clients' requests meet on it as in the reproduction; 10 ms per token: the
    # victim's generation runs ~3 s, time for the second client to come and go. The engine records ids.
    sim = SimOptions(itl_ms=10.0, record_calls=64)
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("ids")), engines=1, sim=sim) as s:
        yield s


def streamed(stack: Stack, max_tokens: int) -> dict[str, object]:
    return {
        "model": stack.model,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


def test_a_client_reusing_anothers_request_id_cannot_cut_its_stream(stack: Stack) -> None:
    engine = stack.engines.engines[0]
    shared = {"x-request-id": "victim-id-1"}
    victim = post_json(stack.base_url, "/v1/chat/completions", streamed(stack, VICTIM_TOKENS), 30, shared)
    victim_response = victim.getresponse()
    assert victim_response.status == 200
    first = victim_response.readline()  # the victim's stream is flowing
    assert first.startswith(b"data: "), first

    attacker = post_json(stack.base_url, "/v1/chat/completions", streamed(stack, 1000), 30, shared)
    attacker_response = attacker.getresponse()
    assert attacker_response.status == 200
    assert attacker_response.read(6) == b"data: "
    attacker.close()  # the second client hangs up: extproc aborts its engine request
    assert wait_for(lambda: engine.stats.abort_calls == 1), "the attacker's request was not aborted"

    events = [json.loads(first.removeprefix(b"data: ")), *read_events(victim_response)]
    victim.close()
    finish = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finish == ["length"], finish
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == VICTIM_TOKENS
    # The client's id is the one it sees echoed, on both requests.
    assert victim_response.getheader("x-request-id") == "victim-id-1"
    assert attacker_response.getheader("x-request-id") == "victim-id-1"
    # The engine knew the two requests by two ids of extproc's, neither the client's.
    ids = [call.request_id for call in list(engine.core.recorded)[-2:]]
    assert len(set(ids)) == 2 and "victim-id-1" not in ids, ids


@pytest.mark.parametrize("client_id", [None, "reused-id"])
def test_requests_get_distinct_engine_and_response_ids(stack: Stack, client_id: str | None) -> None:
    """Envoy gives each request a fresh x-request-id unless the client sends one (kept from loopback):
    either way, five requests in well under a second (the old fallback id was one per second) are five
    engine requests and five response ids."""
    engine = stack.engines.engines[0]
    before = len(engine.core.recorded)
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 1}
    headers = {"x-request-id": client_id} if client_id else {}
    response_ids = []
    for _ in range(5):
        conn = post_json(stack.base_url, "/v1/completions", body, headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        response_ids.append(json.loads(response.read())["id"])
        conn.close()
    ids = [call.request_id for call in list(engine.core.recorded)[before:]]
    assert len(ids) == 5 and len(set(ids)) == 5, ids
    assert len(set(response_ids)) == 5, response_ids


def test_batched_prompts_get_one_engine_id_each_from_one_prefix(stack: Stack) -> None:
    engine = stack.engines.engines[0]
    before = len(engine.core.recorded)
    body = {"model": stack.model, "prompt": ["one", "two", "three"], "max_tokens": 1}
    conn = post_json(stack.base_url, "/v1/completions", body, headers={"x-request-id": "batch-1"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    assert len(json.loads(response.read())["choices"]) == 3
    conn.close()
    ids = sorted(call.request_id for call in list(engine.core.recorded)[before:])
    prefix = ids[0].rsplit("-", 1)[0]
    assert ids == [f"{prefix}-{i}" for i in range(3)], ids
    assert "batch-1" not in prefix
