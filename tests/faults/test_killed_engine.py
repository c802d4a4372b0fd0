"""An engine killed under load (issue 15: 111 requests got 503 in the 5 s after a SIGKILL). The simulated
engine stops at once (its server cancels every call and closes its port, as a killed process's do): the
requests it was serving end with an error, new ones that reach it fail to connect and Envoy retries them
on the fallback, and extproc's router ejects it at the first report, before the pool's health check
notices. Requests sent after a short bound all succeed."""

from __future__ import annotations

import threading
import time

from tests.faults.clients import Outcome, chat, tally
from tests.integration.harness import Stack

# Requests sent later than this after the kill must all succeed.
SETTLE_S = 1.0
CLIENTS = 8


def test_requests_after_an_engine_is_killed_succeed(stack: Stack) -> None:
    victim, survivor = stack.engines.engines
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            outcomes.append(chat(stack, stream=bool(i % 2), text=f"client {i} request {n}", timeout=30))
            n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        killed_at = time.monotonic()
        stack.loop.run(victim.stop(grace=None))
        time.sleep(4.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    before = [o for o in outcomes if o.started < killed_at]
    after = [o for o in outcomes if o.started >= killed_at + SETTLE_S]
    assert before and all(o.ok for o in before if o.started + o.seconds < killed_at), tally(before)
    assert len(after) >= 10, "the survivor kept serving"
    assert tally(after) == {"200": len(after)}, tally(after)
    assert survivor.stats.completed >= len(after)
