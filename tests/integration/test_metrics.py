"""The metrics port of a running gateway (real Envoy, simulated engine): after known traffic, streamed and
not, one failure (a 400) and one shed request (a 429), `/metrics` counts exactly that traffic; `/engines`
and `extproc status` show the engine.

The data plane's registry is one per process and other stacks of this test session count into it too:
each check compares a scrape before the traffic with one after it."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extproc import cli, contracts
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.exposition import Scrape, delta, scrape
from tests.integration.harness import Stack, local_stack, post_json, wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LOAD_INTERVAL_S = 0.05
# Requests the traffic sends: 5 chat answered 200 (2 whole, 3 streamed), 1 completion, 1 400, 1 429.
SENT = 8


@dataclass
class Traffic:
    before: Scrape
    after: Scrape
    metrics_url: str
    engine: str
    # Usage the clients were told, per API.
    prompt_tokens: dict[str, int]
    completion_tokens: dict[str, int]
    cached_tokens: int
    # The /engines view and the in-flight gauge while the shed request was refused (two requests in flight).
    engines_busy: dict[str, Any]
    in_flight_busy: float


@pytest.fixture(scope="module", params=["ext_proc", "module"])
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # One engine running one sequence at a time: a second request queues, and a third sheddable one is shed.
    # On both response paths: with the Envoy module, the tokens and finish reasons reach extproc's
    # summaries through the trailers' metadata.
    sim = SimOptions(max_num_seqs=1, itl_ms=20.0)
    config = json.dumps({"shed_queue_depth": 1, "objectives": {"batch": -1}})
    tmp = tmp_path_factory.mktemp("metrics")
    with local_stack(
        FreePorts(),
        tmp,
        engines=1,
        sim=sim,
        routing_config=config,
        load_interval=LOAD_INTERVAL_S,
        response_path=request.param,
    ) as s:
        s.gateway.serve_metrics("127.0.0.1", 0)
        yield s


def _usage_of(body: bytes, streamed: bool) -> dict[str, Any]:
    if not streamed:
        return json.loads(body)["usage"]
    chunks = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    return usage


def _send(stack: Stack, path: str, max_tokens: int, *, stream: bool, objective: str | None = None):
    body: dict[str, Any] = {"model": stack.model, "max_tokens": max_tokens, "ignore_eos": True}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "how many requests were there?"}]
    else:
        body["prompt"] = "count these tokens"
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    headers = {contracts.OBJECTIVE_HEADER: objective} if objective else None
    return post_json(stack.base_url, path, body, timeout=20, headers=headers)


@pytest.fixture(scope="module")
def traffic(stack: Stack) -> Traffic:
    assert stack.gateway.metrics is not None
    url = stack.gateway.metrics.url
    (engine,) = stack.engines.engines
    address = stack.engines.addresses[0]
    before = scrape(url)
    prompt = {CHAT: 0, COMPLETIONS: 0}
    completion = {CHAT: 0, COMPLETIONS: 0}
    cached = 0

    def count(path: str, response: http.client.HTTPResponse, streamed: bool) -> None:
        nonlocal cached
        assert response.status == 200
        usage = _usage_of(response.read(), streamed)
        prompt[path] += usage["prompt_tokens"]
        completion[path] += usage["completion_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    for path, stream in [(CHAT, False), (CHAT, False), (CHAT, True), (COMPLETIONS, False)]:
        count(path, _send(stack, path, 5, stream=stream).getresponse(), stream)
    bad = post_json(stack.base_url, CHAT, "not an object").getresponse()
    assert bad.status == 400, bad.read()
    bad.read()
    # Shedding as tests/integration/test_shedding.py does it: one long stream runs, a sheddable one queues
    # behind it, the next sheddable one is refused.
    calls = engine.stats.generate_requests
    running = _send(stack, CHAT, 100, stream=True).getresponse()
    assert running.status == 200 and running.read(6) == b"data: "
    time.sleep(LOAD_INTERVAL_S * 6)
    queued = _send(stack, CHAT, 1, stream=True, objective="batch")
    assert wait_for(lambda: engine.stats.generate_requests == calls + 2, timeout=5)
    shed = _send(stack, CHAT, 1, stream=True, objective="batch").getresponse()
    assert shed.status == 429, shed.read()
    shed.read()
    with urllib.request.urlopen(url + "/engines", timeout=5) as r:
        engines_busy = json.load(r)
    in_flight_busy = scrape(url).value("extproc_engine_in_flight_requests", model=stack.model, engine=address)
    count(CHAT, running, True)
    count(CHAT, queued.getresponse(), True)

    def all_counted() -> bool:
        return scrape(url).total("extproc_requests_total") - before.total("extproc_requests_total") >= SENT

    assert wait_for(all_counted, timeout=10), "every request is counted once its stream ends"
    return Traffic(
        before, scrape(url), url, address, prompt, completion, cached, engines_busy, in_flight_busy
    )


def test_requests_are_counted_by_api_status_and_engine(stack: Stack, traffic: Traffic) -> None:
    d = lambda **labels: delta(traffic.before, traffic.after, "extproc_requests_total", **labels)  # noqa: E731
    m, e = stack.model, traffic.engine
    assert d(model=m, api=CHAT, status="200", engine=e) == 5
    assert d(model=m, api=COMPLETIONS, status="200", engine=e) == 1
    assert d(api=CHAT, status="400") == 1  # the body never parsed: no model
    assert d(model=m, api=CHAT, status="429") == 1  # shed before any engine
    total = traffic.after.total("extproc_requests_total") - traffic.before.total("extproc_requests_total")
    assert total == SENT


def test_token_counters_match_the_usage_clients_were_told(stack: Stack, traffic: Traffic) -> None:
    d = lambda name: delta(traffic.before, traffic.after, name, model=stack.model)  # noqa: E731
    assert d("extproc_prompt_tokens_total") == sum(traffic.prompt_tokens.values())
    assert d("extproc_completion_tokens_total") == sum(traffic.completion_tokens.values())
    assert d("extproc_cached_tokens_total") == traffic.cached_tokens
    usage = "gen_ai_client_token_usage"
    for path, op in [(CHAT, "chat"), (COMPLETIONS, "text_completion")]:
        labels = {"gen_ai_operation_name": op, "gen_ai_request_model": stack.model}
        sent = 5 if path == CHAT else 1
        for kind, told in [("input", traffic.prompt_tokens), ("output", traffic.completion_tokens)]:
            series = {**labels, "gen_ai_token_type": kind}
            assert delta(traffic.before, traffic.after, f"{usage}_count", **series) == sent
            assert delta(traffic.before, traffic.after, f"{usage}_sum", **series) == told[path]
            assert delta(traffic.before, traffic.after, f"{usage}_bucket", **series, le="+Inf") == sent


def test_genai_latency_histograms_count_each_request_once(stack: Stack, traffic: Traffic) -> None:
    def count(name: str, **labels: str) -> float:
        return delta(traffic.before, traffic.after, f"{name}_count", **labels)

    chat = {"gen_ai_operation_name": "chat", "gen_ai_request_model": stack.model}
    duration = "gen_ai_server_request_duration_seconds"
    assert count(duration, **chat) == 5
    assert count(duration, gen_ai_operation_name="text_completion", gen_ai_request_model=stack.model) == 1
    assert count(duration, **chat, error_type="429") == 1
    assert count(duration, gen_ai_operation_name="chat", error_type="400") == 1
    # Streamed successes only: three streams; the one-token stream has no time per output token.
    assert count("gen_ai_server_time_to_first_token_seconds", **chat) == 3
    assert count("gen_ai_server_time_per_output_token_seconds", **chat) == 2
    assert traffic.after.types[duration] == "histogram"


def test_routing_decisions_and_phases_follow_the_requests(stack: Stack, traffic: Traffic) -> None:
    def routed(reason: str) -> float:
        return delta(
            traffic.before,
            traffic.after,
            "extproc_routing_decisions_total",
            model=stack.model,
            policy="kv_events",
            reason=reason,
        )

    assert routed("hit") + routed("miss") + routed("spill") == 6
    assert routed("shed") == 1
    assert routed("no_endpoint") == routed("fallback") == 0

    def phase(name: str) -> float:
        return delta(traffic.before, traffic.after, "extproc_phase_duration_seconds_count", phase=name)

    # 8 bodies parsed; 6 chat prompts templated (the 429 too); 7 prompts tokenized and routed; 6 sent.
    assert (phase("parse"), phase("template"), phase("tokenize"), phase("route"), phase("encode")) == (
        8,
        6,
        7,
        7,
        6,
    )
    # At least one response chunk per engine call decoded by extproc; none with the Envoy module, which
    # decodes them itself.
    assert phase("decode") >= 6 if stack.response_path == "ext_proc" else phase("decode") == 0


def test_engine_gauges_and_the_engine_view(stack: Stack, traffic: Traffic) -> None:
    # While the shed request was refused, two requests were in flight on the one engine.
    assert traffic.in_flight_busy == 2
    (busy,) = traffic.engines_busy["engines"]
    assert busy["in_flight_requests"] == 2
    after = traffic.after
    labels = {"model": stack.model, "engine": traffic.engine}
    assert after.value("extproc_engine_healthy", **labels) == 1
    assert after.value("extproc_engine_in_flight_requests", **labels) == 0
    assert after.value("extproc_engine_penalty_state", **labels) == 0
    assert after.value("extproc_health_check_up", **labels, protocol="vllm") == 1
    assert after.value("extproc_model_ready", model=stack.model) == 1
    assert after.types["extproc_engine_healthy"] == "gauge"
    with urllib.request.urlopen(traffic.metrics_url + "/engines", timeout=5) as r:
        (view,) = json.load(r)["engines"]
    assert view["model"] == stack.model and view["engine"] == traffic.engine
    assert view["protocol"] == "vllm" and view["healthy"] is True
    assert view["in_flight_requests"] == 0 and view["penalty"] == "closed" and view["problem"] is None
    assert view["cached_blocks"] == after.value("extproc_engine_cached_blocks", **labels)
    # It served prompts of several blocks: the router no longer prices it as holding nothing.
    assert view["nothing_cached"] is False
    assert after.value("extproc_engine_nothing_cached", **labels) == 0


def test_an_unknown_path_is_404(traffic: Traffic) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(traffic.metrics_url + "/nothing", timeout=5)
    assert e.value.code == 404


def test_extproc_status_prints_the_engine_table(stack: Stack, traffic: Traffic) -> None:
    # As an operator runs it: its own process, so the in-process gateway's logs cannot land in its output.
    status = subprocess.run(
        [sys.executable, "-m", "extproc", "status", "--metrics-url", traffic.metrics_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    header, row = status.stdout.splitlines()
    assert header.split() == [
        "MODEL",
        "ENGINE",
        "PROTOCOL",
        "HEALTH",
        "IN-FLIGHT",
        "TOKENS",
        "RUNNING",
        "WAITING",
        "KV",
        "BLOCKS",
        "PENALTY",
    ]
    cells = row.split()
    assert cells[:5] == [stack.model, traffic.engine, "vllm", "up", "0"]
    assert cells[-1] == "closed"


def test_extproc_status_says_when_nothing_answers(
    free_ports: FreePorts, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["status", "--metrics-url", f"http://127.0.0.1:{free_ports.one()}"]) == 1
    assert "cannot read http://127.0.0.1:" in capsys.readouterr().err
