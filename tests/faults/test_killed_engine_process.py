"""An engine process killed (SIGKILL: a crash, the OOM killer) while it holds calls it accepted and has
not answered yet, queued or in prefill. The kernel closes its connections; Envoy sees each call reset
before a byte of its answer and retries it on the request's fallback (`retry_on: reset`), so the client
gets its whole answer from another engine instead of a 503. Before that retry, each such call was a
503 "the selected engine is unavailable".

The engines are `python -m extproc.simulator` processes behind `extproc up`, so the kill is a real one:
in-process simulated engines can only stop their gRPC server, which ends calls another way."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tests.conftest import FreePorts
from tests.faults.clients import Outcome, chat_at, tally
from tests.faults.sse import parse_events
from tests.integration.exposition import scrape
from tests.integration.test_stack_up import REPO, running_up

MODEL = "llama3-default"
MAX_TOKENS = 8


LISTENING = re.compile(r"engine 0 listening on (\S+) \(metrics on port \d+\)\n")


@dataclass
class EngineProcess:
    process: subprocess.Popen[str]
    address: str
    metrics_port: int


@contextmanager
def engine_process(ports: FreePorts, faults: dict[str, object]) -> Iterator[EngineProcess]:
    """One simulated engine in its own process."""
    metrics_port = ports.one()
    argv = [sys.executable, "-m", "extproc.simulator", "--port", str(ports.one()), "--engines", "1"]
    argv += ["--metrics-port", str(metrics_port), "--faults", json.dumps(faults)]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        match = LISTENING.fullmatch(process.stdout.readline())
        assert match, "the simulator did not start"
        yield EngineProcess(process, match.group(1), metrics_port)
    finally:
        process.kill()
        process.wait()


def _holding(metrics_port: int) -> int:
    """Requests the engine holds, running or waiting."""
    metrics = scrape(f"http://127.0.0.1:{metrics_port}")
    return int(metrics.total("vllm:num_requests_running") + metrics.total("vllm:num_requests_waiting"))


def _completion_tokens(outcome: Outcome) -> int:
    if outcome.body.startswith("{"):
        return json.loads(outcome.body)["usage"]["completion_tokens"]
    return next(e["usage"]["completion_tokens"] for e in parse_events(outcome.body) if e.get("usage"))


def test_calls_a_killed_engine_had_not_answered_are_served_by_the_fallback(tmp_path: Path) -> None:
    ports = FreePorts()
    # The killed engine accepts calls and never steps, so every call it holds is open and silent.
    with engine_process(ports, {"stall": True}) as killed, engine_process(ports, {}) as other:
        # Round robin alternates the engines whatever their loads: two of the four requests land on each.
        extra = (
            "--engine",
            f"grpc://{killed.address},grpc://{other.address}",
            "--routing-policy",
            "round_robin",
        )
        pool = concurrent.futures.ThreadPoolExecutor(4)
        with running_up(tmp_path, ports, *extra, sim=0) as (_, port, _), pool:
            calls = []
            # Sent one at a time, each placed before the next, so the killed engine holds one unary and
            # one streamed call whichever engine round robin starts on.
            for i, stream in enumerate([False, False, True, True]):
                held = _holding(killed.metrics_port)
                base_url, text = f"http://127.0.0.1:{port}", f"request {i}"
                call = partial(
                    chat_at, base_url, MODEL, stream=stream, text=text, max_tokens=MAX_TOKENS, usage=stream
                )
                calls.append(pool.submit(call))
                deadline = time.monotonic() + 10
                while not calls[-1].done() and _holding(killed.metrics_port) == held:
                    assert time.monotonic() < deadline, "the request reached neither engine"
                    time.sleep(0.02)
            assert _holding(killed.metrics_port) == 2, "the killed engine does not hold two calls"
            killed.process.kill()
            outcomes = [call.result(timeout=30) for call in calls]
        served_by_other = scrape(f"http://127.0.0.1:{other.metrics_port}").total("vllm:request_success_total")

    assert tally(outcomes) == {"200": 4}, [o.body[-200:] for o in outcomes]
    assert [_completion_tokens(o) for o in outcomes] == [MAX_TOKENS] * 4
    assert served_by_other == 4
