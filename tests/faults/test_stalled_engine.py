"""A stalled engine: its scheduler stops while its health check still answers, as vLLM's does (issue
15: clients hung forever; 21 of 40 concurrent requests went to it). With `first_token_timeout` set short
the requests it holds end with 504 within that deadline, its calls are aborted, and later requests avoid
it; a stream that stalls between tokens ends with an SSE error event and [DONE], on both response paths
(with the Envoy module extproc times the first token, the module each next one: the same error, the same
abort). The Responses API's own engine calls (issue 18) keep the same deadlines: a stream stalling mid-way
ends with `response.failed`, a non-streamed call with 504, and the engine call is aborted either way."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from extproc.simulator import SimOptions
from extproc.simulator.cluster import SimEngine
from tests.conftest import FreePorts
from tests.faults.clients import chat, concurrently, tally
from tests.integration.harness import Stack, local_stack, post_json, wait_for

FIRST_TOKEN_S = 1.5
INTER_TOKEN_S = 1.0
# On a busy 2-core machine a 504 may come this much later than the deadline.
MARGIN_S = 3.0


@pytest.fixture(params=["ext_proc", "module"])
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    settings = {"first_token_timeout": FIRST_TOKEN_S, "inter_token_timeout": INTER_TOKEN_S}
    with local_stack(
        FreePorts(),
        tmp_path,
        engines=2,
        fallbacks=1,
        routing_policy="kv_events",
        extproc_settings=settings,
        response_path=request.param,
    ) as s:
        yield s


@pytest.mark.parametrize("stream", [True, False])
def test_stalled_engine_requests_end_with_504_and_later_ones_avoid_it(stack: Stack, stream: bool) -> None:
    stalled, _healthy = stack.engines.engines
    stalled.faults.set(stall=True)
    # Non-streamed: the engine answers once at the end, so the deadline covers the whole generation.
    max_tokens = 4
    limit = FIRST_TOKEN_S if stream else FIRST_TOKEN_S + INTER_TOKEN_S * max_tokens

    first = concurrently(10, lambda i: chat(stack, stream=stream, text=f"first {i}", max_tokens=max_tokens))
    timed_out = [o for o in first if o.status == 504]
    assert {o.status for o in first} <= {200, 504}, tally(first)
    assert timed_out, "some requests went to the stalled engine before it was known to stall"
    for o in timed_out:
        assert o.seconds < limit + MARGIN_S, (o.seconds, o.body)
        assert '"type":"timeout"' in o.body.replace(" ", "")
    assert wait_for(lambda: stalled.stats.abort_calls >= len(timed_out)), "the stalled calls were not aborted"

    drawn = stalled.stats.generate_requests
    second = concurrently(10, lambda i: chat(stack, stream=stream, text=f"second {i}", max_tokens=max_tokens))
    assert tally(second) == {"200": 10}
    assert stalled.stats.generate_requests - drawn <= 1, "only a probe may reach the stalled engine"
    assert max(o.seconds for o in second) < limit + MARGIN_S


@pytest.fixture(scope="module", params=["ext_proc", "module"])
def slow_stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One engine generating a token every 50 ms: a stall can be started mid-stream. Each test stalls it
    and starts it again; the single engine is still picked while its penalty runs (no other candidate).
    Once per response path."""
    settings = {"first_token_timeout": FIRST_TOKEN_S, "inter_token_timeout": INTER_TOKEN_S}
    slow = SimOptions(itl_ms=50.0)
    tmp = Path(tmp_path_factory.mktemp("slow"))
    with local_stack(
        FreePorts(), tmp, engines=1, sim=slow, extproc_settings=settings, response_path=request.param
    ) as s:
        yield s


@pytest.fixture
def engine(slow_stack: Stack) -> Iterator[SimEngine]:
    (engine,) = slow_stack.engines.engines
    try:
        yield engine
    finally:
        engine.faults.set(stall=False)


def test_a_stream_stalling_between_tokens_ends_with_an_error_event(
    slow_stack: Stack, engine: SimEngine
) -> None:
    aborted = engine.stats.abort_calls
    body = {"model": slow_stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": 200, "ignore_eos": True}
    conn = post_json(slow_stack.base_url, "/v1/chat/completions", body, timeout=30)
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # tokens flow
    engine.faults.set(stall=True)
    stalled_at = time.monotonic()
    raw = response.read().decode()
    conn.close()
    assert time.monotonic() - stalled_at < INTER_TOKEN_S + MARGIN_S
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error == {
        "message": "the engine sent no next token within 1 s (inter_token_timeout)",
        "type": "timeout",
        "param": None,
        "code": 504,
    }
    assert wait_for(lambda: engine.stats.abort_calls == aborted + 1), "the stalled call was not aborted"
    assert wait_for(lambda: engine.stats.active == 0), "the engine kept the call"


def test_a_responses_stream_stalling_between_tokens_ends_with_response_failed(
    slow_stack: Stack, engine: SimEngine
) -> None:
    aborted = engine.stats.abort_calls
    client = slow_stack.openai()
    stream = client.responses.create(
        model=slow_stack.model, input="Go on.", max_output_tokens=200, stream=True
    )
    events = []
    for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta":
            break  # tokens flow
    engine.faults.set(stall=True)
    stalled_at = time.monotonic()
    events.extend(stream)
    assert time.monotonic() - stalled_at < INTER_TOKEN_S + MARGIN_S
    last = events[-1]
    assert last.type == "response.failed", [e.type for e in events[-3:]]
    assert last.response.status == "failed"
    assert last.response.error.code == "server_error"
    assert "inter_token_timeout" in last.response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert wait_for(lambda: engine.stats.abort_calls == aborted + 1), "the stalled call was not aborted"


def test_a_responses_call_to_a_stalled_engine_ends_with_504(slow_stack: Stack, engine: SimEngine) -> None:
    """Not streamed: one deadline for the whole generation, first_token + inter_token x max tokens."""
    aborted = engine.stats.abort_calls
    engine.faults.set(stall=True)
    max_tokens = 2
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        slow_stack.openai().responses.create(
            model=slow_stack.model, input="Hi.", max_output_tokens=max_tokens
        )
    assert time.monotonic() - started < FIRST_TOKEN_S + INTER_TOKEN_S * max_tokens + MARGIN_S
    assert e.value.status_code == 504
    assert "first_token_timeout + inter_token_timeout" in e.value.body["message"]
    assert wait_for(lambda: engine.stats.abort_calls == aborted + 1), "the stalled call was not aborted"
