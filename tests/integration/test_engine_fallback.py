"""Fallback engines (the endpoint-picker protocol's ordered list): when Envoy knows the engines, as under
`extproc up`, a request whose picked engine refuses it or is gone is served by the next engine extproc
listed, and extproc follows the engine that actually answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, Stack, local_stack, post_json, wait_for


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with local_stack(FreePorts(), tmp_path, engines=2, routing_policy="round_robin", fallbacks=1) as s:
        yield s


def _chat(stack: Stack, text: str) -> str:
    client = stack.openai(timeout=20)
    reply = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": text}], max_tokens=4, seed=1
    )
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length") and content is not None
    return content


def test_a_refusing_engine_is_skipped_for_the_next_in_the_list(stack: Stack) -> None:
    refusing, healthy = stack.engines.engines
    # The engine keeps answering its health checks but refuses every Generate as UNAVAILABLE.
    refusing.faults.set(fail_code="UNAVAILABLE", fail_message="draining")
    for i in range(4):  # round robin would pick the refusing engine for half of them
        _chat(stack, f"question {i}")
    # The first refusal, retried on the fallback, gets the engine ejected by the router: not picked again.
    assert refusing.stats.faults == 1, "the refusing engine was picked once, then avoided"
    assert healthy.stats.completed == 4, "every request was served by the other engine"


def test_a_stopped_engine_is_skipped_before_health_checks_notice(stack: Stack) -> None:
    gone, healthy = stack.engines.engines
    stack.loop.run(gone.stop(0))
    for i in range(4):
        _chat(stack, f"question {i}")
    assert healthy.stats.completed == 4


def test_the_abort_follows_the_engine_that_answered(tmp_path: Path) -> None:
    """The client leaves mid-stream after a fallback: the Abort goes to the engine generating, not to
    the one extproc picked first."""
    slow = SimOptions(itl_ms=50.0)  # a 200-token stream takes 10 s: long enough to walk away from
    with local_stack(FreePorts(), tmp_path, sim=slow, routing_policy="round_robin", fallbacks=1) as stack:
        refusing, healthy = stack.engines.engines
        refusing.faults.set(fail_code="UNAVAILABLE", fail_message="draining")
        for _ in range(2):  # one of the two picks is the refusing engine
            body = {"model": stack.model, "messages": [{"role": "user", "content": "x"}], "stream": True}
            body |= {"max_tokens": 200, "ignore_eos": True}
            conn = post_json(stack.base_url, "/v1/chat/completions", body)
            response = conn.getresponse()
            assert response.status == 200
            assert response.read(6) == b"data: "  # the stream is flowing
            conn.close()  # the client goes away
        assert refusing.stats.faults == 1
        assert wait_for(lambda: healthy.stats.abort_calls == 2), healthy.stats
        assert wait_for(lambda: healthy.stats.active == 0), "the engine kept generating"
        assert refusing.stats.abort_calls == 0


def test_retries_stay_with_the_request_s_model(tmp_path: Path) -> None:
    """Every model's engines in one Envoy cluster: a request's retries end with its own model's
    fallbacks and never reach another model's engine (Envoy would otherwise pick any engine of the
    cluster once extproc's list is spent)."""
    models = [SimModel("alpha", engines=2, routing_policy="round_robin"), SimModel("beta", engines=1)]
    with local_stack(FreePorts(), tmp_path, models=models, fallbacks=1) as stack:
        alpha, (beta,) = stack.clusters["alpha"].engines, stack.clusters["beta"].engines
        beta.faults.set(fail_code="UNAVAILABLE", fail_message="draining")
        body = {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        # A client cannot ask Envoy for more retries either.
        conn = post_json(stack.base_url, "/v1/chat/completions", body, headers={"x-envoy-max-retries": "3"})
        response = conn.getresponse()
        assert response.status == 503, response.read()
        conn.close()
        assert beta.stats.faults == 1
        assert sum(e.stats.generate_requests for e in alpha) == 0, "beta's request reached an alpha engine"

        # Alpha's own fallback still works: its refusing engine is skipped for the other.
        refusing, healthy = alpha
        refusing.faults.set(fail_code="UNAVAILABLE", fail_message="draining")
        client = stack.openai(timeout=20)
        for i in range(4):
            reply = client.chat.completions.create(
                model="alpha", messages=[{"role": "user", "content": f"q {i}"}], max_tokens=4
            )
            assert reply.choices[0].message.content
        assert refusing.stats.faults == 1 and healthy.stats.completed == 4  # then ejected
        assert beta.stats.generate_requests == 1


def test_a_fallback_that_answered_is_priced_as_holding_the_prompt(tmp_path: Path) -> None:
    """An engine without KV events counts as holding nothing (fresh: its requests' uncached tokens priced
    at `fresh_cache_weight`) until a prompt of a block or more is sent to it. When the picked engine
    refuses and Envoy's retry lands on a fallback, the prompt is prefilled there: the router must count
    it, or that engine keeps drawing new prefixes as if it were empty."""
    slow = SimOptions(itl_ms=50.0)  # the holding stream below lasts 10 s
    settings = {"kv_events": "off"}  # freshness then rests on what the gateway sent
    with local_stack(FreePorts(), tmp_path, sim=slow, fallbacks=1, extproc_settings=settings) as stack:
        # A stream whose prompt is shorter than a KV block keeps one engine busy and leaves it fresh.
        body = {"model": stack.model, "prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
        holding = post_json(stack.base_url, "/v1/completions", body)
        response = holding.getresponse()
        assert response.status == 200 and response.read(6) == b"data: "
        (busy,) = [e for e in stack.engines.engines if e.stats.active == 1]
        (idle,) = [e for e in stack.engines.engines if e is not busy]
        view = {e["engine"]: e for e in stack.gateway.gateway.engines()}
        assert view[busy.address]["nothing_cached"] and view[idle.address]["nothing_cached"]

        # The idle fresh engine is the pick for a long prompt (a quarter of its tokens against three
        # times them on the busy one); it refuses, and Envoy retries on the busy one, the fallback.
        idle.faults.set(fail_code="UNAVAILABLE", fail_message="draining")
        _chat(stack, "a question long enough to fill several KV blocks of the engine " * 4)
        assert idle.stats.faults == 1
        assert wait_for(lambda: busy.stats.completed == 1), "the fallback answered"
        view = {e["engine"]: e for e in stack.gateway.gateway.engines()}
        assert not view[busy.address]["nothing_cached"], "the fallback prefilled the prompt"
        holding.close()
