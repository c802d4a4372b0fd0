"""Faults get clean, documented behaviour: client gone → engine Abort; engines down → 503."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

# 50 ms per token: a 200-token generation takes 10 s, long enough to walk away from. Each fault on both
# response paths (extproc, or the extproc_envoy module inside Envoy).
SLOW = SimOptions(itl_ms=50.0)


@pytest.fixture(params=["ext_proc", "module"])
def slow_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A stack of its own, for a test that stops its engines."""
    with local_stack(FreePorts(), tmp_path, sim=SLOW, response_path=request.param) as s:
        yield s


@pytest.fixture(scope="module", params=["ext_proc", "module"])
def module_slow_stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp(f"slow-{request.param}"))
    with local_stack(FreePorts(), tmp, sim=SLOW, response_path=request.param) as s:
        yield s


@pytest.fixture
def shared_slow_stack(module_slow_stack: Stack) -> Iterator[Stack]:
    """The module's stack, for a test whose faults end with it: they are cleared after the test, once
    nothing runs on the engines and the gateway routes to both again, so the next test meets it as new."""
    stack = module_slow_stack
    engines = stack.engines.engines
    yield stack
    for engine in engines:
        engine.faults.clear()
    assert wait_for(lambda: sum(e.stats.active for e in engines) == 0), "a request still runs on an engine"
    assert wait_for(lambda: len(stack.gateway.gateway.endpoints(stack.model)) == len(engines)), (
        "an engine stayed out of the gateway's rotation after its faults were cleared"
    )


def test_client_disconnect_mid_stream_aborts_the_engine_request(shared_slow_stack: Stack) -> None:
    stack = shared_slow_stack
    engines = stack.engines.engines
    aborts, completed = (sum(e.stats.abort_calls for e in engines), sum(e.stats.completed for e in engines))
    body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": 200, "ignore_eos": True}
    conn = post_json(stack.base_url, "/v1/chat/completions", body)
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # the stream is flowing
    conn.close()  # the client goes away

    assert wait_for(lambda: sum(e.stats.abort_calls for e in engines) == aborts + 1), (
        "no Abort reached the engine"
    )
    assert wait_for(lambda: sum(e.stats.active for e in engines) == 0), "the engine kept generating"
    assert sum(e.stats.completed for e in engines) == completed


def test_all_engines_down_gives_503(slow_stack: Stack) -> None:
    slow_stack.loop.run(slow_stack.engines.stop())
    # The pool notices within one health interval; until then Envoy's connect failure is also a 503.
    body = {"model": slow_stack.model, "messages": [{"role": "user", "content": "x"}]}
    for attempt in range(2):
        if attempt:
            time.sleep(2.5)  # past a health interval: the pool knows the engines are gone
        conn = post_json(slow_stack.base_url, "/v1/chat/completions", body)
        r = conn.getresponse()
        payload = json.loads(r.read())
        assert r.status == 503, payload
        assert r.getheader("content-type") == "application/json"
        assert payload["error"]["code"] == 503
        conn.close()


@pytest.mark.parametrize("stream", [True, False])
def test_engine_dying_mid_generation_ends_the_request_with_an_error(slow_stack: Stack, stream: bool) -> None:
    body = {"model": slow_stack.model, "messages": [{"role": "user", "content": "x"}], "stream": stream}
    body |= {"max_tokens": 200, "ignore_eos": True}
    conn = post_json(slow_stack.base_url, "/v1/chat/completions", body, timeout=20)
    engines = slow_stack.engines.engines
    assert wait_for(lambda: sum(e.stats.active for e in engines) == 1)
    time.sleep(0.3)
    slow_stack.loop.run(slow_stack.engines.stop(grace=None))  # the engine process goes away mid-stream
    response = conn.getresponse()
    raw = response.read().decode()  # must end, not hang
    if stream:
        assert response.status == 200
        events = [e for e in raw.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert "error" in json.loads(events[-2].removeprefix("data: "))
    else:
        assert response.status >= 500
        assert json.loads(raw)["error"]["code"] == response.status


@pytest.mark.parametrize(
    ("code", "status"), [("INVALID_ARGUMENT", 400), ("RESOURCE_EXHAUSTED", 429), ("INTERNAL", 500)]
)
@pytest.mark.parametrize("stream", [False, True])
def test_engine_errors_map_to_http_statuses(
    shared_slow_stack: Stack, code: str, status: int, stream: bool
) -> None:
    stack = shared_slow_stack
    for engine in stack.engines.engines:
        engine.faults.set(fail_code=code, fail_message="refused by the engine")
    body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": stream}
    r = post_json(stack.base_url, "/v1/chat/completions", body).getresponse()
    payload = json.loads(r.read())
    assert r.status == status, payload
    assert r.getheader("content-type") == "application/json"
    assert payload["error"]["message"] == "engine error: refused by the engine"
    assert not [h for h, _ in r.getheaders() if h.lower().startswith("grpc-")]


def test_engine_cut_mid_stream_gives_an_error_event(shared_slow_stack: Stack) -> None:
    stack = shared_slow_stack
    for engine in stack.engines.engines:
        engine.faults.set(die_after_tokens=3)
    body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": 50, "ignore_eos": True}
    r = post_json(stack.base_url, "/v1/chat/completions", body).getresponse()
    events = [e for e in r.read().decode().split("\n\n") if e]
    assert r.status == 200
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == 503
    text_events = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    # The engine dies after 3 tokens; gRPC may drop some already written when the stream is torn down.
    assert 0 < sum(1 for e in text_events if e["choices"][0]["delta"].get("content")) <= 3
