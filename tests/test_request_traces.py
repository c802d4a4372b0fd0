"""Spans and log lines from the native server's finished-request records (extproc.request_traces,
extproc.request_log), without a stack: records as `take_summaries` returns them."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from extproc.request_log import fields
from extproc.request_traces import PinnedIds, SpanWriter, tracing_wanted

MS = 1_000_000


def record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "request_id": "r-1",
        "engine_request_id": "e-1",
        "path": "/v1/completions",
        "model": "m",
        "endpoint": "10.0.0.1:5",
        "status": 200,
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "cached_tokens": 0,
        "finish_reason": "length",
        "error": "",
        "objective": "",
        "priority": 0,
        "api_key": "",
        "aborted": False,
        "duration_s": 0.01,
        "timings_ns": {
            "received": 1000 * MS,
            "body": 1001 * MS,
            "parsed": 1002 * MS,
            "tokenized": 1004 * MS,
            "routed": 1005 * MS,
            "first_token": 1015 * MS,
            "finished": 1020 * MS,
        },
        "trace": {
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "parent_span_id": None,
            "engine_span_id": "b7ad6b7169203331",
            "sampled": True,
        },
    }
    return base | changes


def written(rec: dict[str, Any]) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=PinnedIds())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    SpanWriter(provider).write(rec)
    return {s.name: s for s in exporter.get_finished_spans()}


def test_tracing_is_on_by_setting_or_an_otlp_endpoint_unless_the_sdk_is_disabled() -> None:
    assert not tracing_wanted(False, {})
    assert tracing_wanted(True, {})
    assert tracing_wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert tracing_wanted(False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing_wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert not tracing_wanted(True, {"OTEL_TRACES_EXPORTER": "none"})


def test_a_new_trace_keeps_the_ids_the_engine_was_given_and_the_recorded_times() -> None:
    spans = written(record())
    root, call = spans["extproc.request"], spans["extproc.engine_call"]
    assert root.parent is None
    assert root.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert call.context.span_id == 0xB7AD6B7169203331

    def interval(name: str) -> tuple[int | None, int | None]:
        return spans[name].start_time, spans[name].end_time

    assert interval("extproc.request") == (1000 * MS, 1020 * MS)
    assert interval("extproc.tokenize") == (1002 * MS, 1004 * MS)
    assert interval("extproc.prefill") == (1005 * MS, 1015 * MS)
    assert interval("extproc.decode") == (1015 * MS, 1020 * MS)
    assert root.attributes is not None and root.attributes["gen_ai.operation.name"] == "text_completion"
    assert root.status.is_ok


def test_an_answer_from_the_gateway_itself_is_one_span_and_a_failure_is_an_error() -> None:
    times = {"received": 1000 * MS, "finished": 1001 * MS}
    rec = record(status=503, error="no engine", path="/v1/models", timings_ns=times)
    spans = written(rec)
    assert set(spans) == {"extproc.request"}
    assert not spans["extproc.request"].status.is_ok


def test_a_client_that_does_not_sample_gets_no_spans_and_untraced_records_none() -> None:
    trace = record()["trace"] | {"parent_span_id": "00f067aa0ba902b7", "sampled": False}
    assert written(record(trace=trace)) == {}
    assert written(record(trace=None)) == {}


def test_the_log_line_has_the_request_its_timings_and_tokens_but_no_text() -> None:
    line = fields(record())
    assert line["request_id"] == "r-1" and line["model"] == "m" and line["engine"] == "10.0.0.1:5"
    assert line["status"] == 200 and line["prompt_tokens"] == 7 and line["completion_tokens"] == 3
    assert line["tokenize_ms"] == 2.0 and line["ttft_ms"] == 15.0 and line["total_ms"] == 20.0
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert "error" not in line and "prompt" not in line and "messages" not in line
