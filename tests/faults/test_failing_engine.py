"""One of two engines refuses every Generate with UNAVAILABLE while its health check passes (issue 15:
12-14 of 20 concurrent requests got 503). Envoy retries a refused request on the fallback extproc listed,
and extproc's router ejects the refusing engine once a stream reports the failure, so it stops drawing
the traffic an idle-looking engine draws."""

from __future__ import annotations

import pytest

from tests.faults.clients import chat, concurrently, tally
from tests.integration.harness import Stack

# Requests of the first wave that may fail: all 20 are routed within milliseconds, before the first
# report of a failure comes back, so the refusing engine draws its share (at most half: each request
# routed there counts as load on it until it ends) and Envoy retries only a few of them on the fallback
# (its cluster's default of 3 concurrent retries; a retry budget in the Envoy config lifts it). The
# router then ejects it: every later request is served.
FIRST_WAVE_FAILURES_BOUND = 10


@pytest.mark.parametrize("stream", [False, True])
def test_one_engine_refusing_loses_no_request_once_it_is_ejected(stack: Stack, stream: bool) -> None:
    refusing, healthy = stack.engines.engines
    refusing.faults.set(fail_code="UNAVAILABLE", fail_message="engine core is down")

    first = concurrently(20, lambda i: chat(stack, stream=stream, text=f"first {i}"))
    failed = [o for o in first if not o.ok]
    assert len(failed) <= FIRST_WAVE_FAILURES_BOUND, tally(first)
    assert all(o.status == 503 for o in failed), tally(first)

    refused_before = refusing.stats.faults
    second = concurrently(20, lambda i: chat(stack, stream=stream, text=f"second {i}"))
    assert tally(second) == {"200": 20}
    # Past its backoff (1 s, then 2 s...) the ejected engine gets one probe at a time, which Envoy
    # retries on the healthy engine: the client does not notice.
    assert refusing.stats.faults - refused_before <= 2, "the ejected engine drew only probes"
    assert healthy.stats.completed >= 40 - len(failed)
