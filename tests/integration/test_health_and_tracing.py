"""Issue 14's health, traces and request logs on a real stack (simulated engines, the native server,
the real Envoy): `GET /health` through Envoy and the gRPC health service on the ext_proc server, with the
engine ready and with none ready; a request that sent a W3C `traceparent` exported as one span tree in
its trace (an in-memory exporter), the engine called under the engine-call span; its log line."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from extproc.request_traces import PinnedIds
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SERVICES = ("", "envoy.service.ext_proc.v3.ExternalProcessor", "liveness", "readiness")

_EXPORTER = InMemorySpanExporter()


def _install_provider() -> None:
    """The process's tracer provider, as an operator's SDK setup would be (set once per process)."""
    provider = TracerProvider(id_generator=PinnedIds())
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _install_provider()
    sim = SimOptions(record_calls=8)
    settings = {"tracing": True, "request_log": True}
    tmp = Path(tmp_path_factory.mktemp("health"))
    with local_stack(FreePorts(), tmp, engines=1, sim=sim, extproc_settings=settings) as s:
        yield s


def get_health(stack: Stack) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{stack.base_url}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def grpc_statuses(stack: Stack) -> dict[str, str]:
    """Each service's Check answer from the ext_proc server (grpcio's health stub)."""
    out = {}
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in SERVICES:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            out[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return out


def set_unhealthy(stack: Stack, unhealthy: bool) -> None:
    stack.engines.engines[0].faults.set(unhealthy=unhealthy)
    stack.loop.run(stack.gateway.pool.check_all())


def test_health_is_ok_while_every_model_has_a_ready_engine(stack: Stack) -> None:
    status, body = get_health(stack)
    assert status == 200, body
    assert body == {"status": "ok", "models": {stack.model: {"ready_engines": 1, "engines": 1}}}
    assert grpc_statuses(stack) == dict.fromkeys(SERVICES, "SERVING")


def test_health_is_503_with_the_reason_when_a_model_has_no_ready_engine(stack: Stack) -> None:
    set_unhealthy(stack, True)
    try:
        status, body = get_health(stack)
        assert status == 503, body
        assert body["status"] == "unavailable"
        assert body["reason"] == f"model '{stack.model}' has no ready engine"
        assert body["models"] == {stack.model: {"ready_engines": 0, "engines": 1}}
        # Not ready, still alive: the supervisor keeps it running. The ext_proc service follows readiness
        # (the endpoint-picker protocol's criteria).
        not_ready = {"readiness": "NOT_SERVING", "envoy.service.ext_proc.v3.ExternalProcessor": "NOT_SERVING"}
        expected = dict.fromkeys(SERVICES, "SERVING") | not_ready
        assert grpc_statuses(stack) == expected
    finally:
        set_unhealthy(stack, False)
    assert get_health(stack)[0] == 200


def test_an_unknown_health_service_is_not_found(stack: Stack) -> None:
    with grpc.insecure_channel(stack.gateway.address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_reports_readiness_as_it_changes(stack: Stack) -> None:
    with grpc.insecure_channel(stack.gateway.address) as channel:
        answers = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=20
        )
        assert next(answers).status == health_pb2.HealthCheckResponse.SERVING
        set_unhealthy(stack, True)
        try:
            assert next(answers).status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            set_unhealthy(stack, False)
        assert next(answers).status == health_pb2.HealthCheckResponse.SERVING
        answers.cancel()


def spans_of(trace_id: int) -> dict[str, ReadableSpan]:
    return {s.name: s for s in _EXPORTER.get_finished_spans() if s.context.trace_id == trace_id}


def test_a_traced_request_is_one_span_tree_and_the_engine_is_called_under_it(stack: Stack) -> None:
    engine = stack.engines.engines[0]
    before = len(engine.core.recorded)
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-request-id": "traced-1"}
    body = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "the secret prompt text"}],
        "max_tokens": 3,
        "stream": True,
    }
    with structlog.testing.capture_logs() as logs:
        conn = post_json(stack.base_url, "/v1/chat/completions", body, headers=headers)
        response = conn.getresponse()
        events = response.read().decode()
        conn.close()
        assert response.status == 200, events
        trace_id = int(CLIENT_TRACE, 16)
        assert wait_for(lambda: "extproc.request" in spans_of(trace_id), timeout=10), "no request span"
        assert wait_for(lambda: any(e.get("request_id") == "traced-1" for e in logs), timeout=5)

    spans = spans_of(trace_id)
    assert set(spans) == {
        "extproc.request",
        "extproc.parse",
        "extproc.tokenize",
        "extproc.route",
        "extproc.engine_call",
        "extproc.prefill",
        "extproc.decode",
    }
    root = spans["extproc.request"]
    assert root.parent is not None and root.parent.span_id == int(CLIENT_SPAN, 16)
    assert root.kind == trace.SpanKind.SERVER
    for child in ("extproc.parse", "extproc.tokenize", "extproc.route", "extproc.engine_call"):
        assert spans[child].parent.span_id == root.context.span_id, child  # type: ignore[union-attr]
    call = spans["extproc.engine_call"]
    for child in ("extproc.prefill", "extproc.decode"):
        assert spans[child].parent.span_id == call.context.span_id, child  # type: ignore[union-attr]
    assert root.attributes is not None and call.attributes is not None
    assert root.attributes["gen_ai.request.model"] == stack.model
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["extproc.request_id"] == "traced-1"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert call.attributes["server.address"] == engine.address
    # The phases follow each other within the request.
    order = ["extproc.parse", "extproc.tokenize", "extproc.route", "extproc.prefill", "extproc.decode"]
    starts = [spans[n].start_time for n in order]
    assert starts == sorted(starts)
    assert root.start_time <= starts[0] and spans["extproc.decode"].end_time <= root.end_time  # type: ignore[operator]

    # The engine got the same trace, its parent the engine-call span.
    (recorded,) = list(engine.core.recorded)[before:]
    sent = recorded.header("traceparent")
    assert sent == f"00-{CLIENT_TRACE}-{call.context.span_id:016x}-01"

    (line,) = [e for e in logs if e.get("request_id") == "traced-1"]
    assert line["event"] == "request"
    assert line["model"] == stack.model
    assert line["engine"] == engine.address
    assert line["status"] == 200
    assert line["completion_tokens"] == 3 and line["prompt_tokens"] > 0
    assert line["trace_id"] == CLIENT_TRACE
    for timing in ("parse_ms", "tokenize_ms", "route_ms", "prefill_ms", "decode_ms", "ttft_ms", "total_ms"):
        assert line[timing] >= 0, timing
    assert "secret prompt" not in json.dumps(line)


def test_a_request_without_traceparent_starts_a_trace_the_engine_joins(stack: Stack) -> None:
    engine = stack.engines.engines[0]
    before = len(engine.core.recorded)
    started = time.time_ns()
    body = {"model": stack.model, "prompt": "hi", "max_tokens": 1}
    conn = post_json(stack.base_url, "/v1/completions", body)
    assert conn.getresponse().status == 200
    conn.close()
    (recorded,) = list(engine.core.recorded)[before:]
    _, trace_hex, parent_hex, _ = str(recorded.header("traceparent")).split("-")
    trace_id = int(trace_hex, 16)
    assert wait_for(lambda: "extproc.engine_call" in spans_of(trace_id), timeout=10)
    spans = spans_of(trace_id)
    assert spans["extproc.engine_call"].context.span_id == int(parent_hex, 16)
    assert spans["extproc.request"].parent is None
    assert spans["extproc.request"].start_time >= started  # type: ignore[operator]
