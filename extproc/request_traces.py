"""OpenTelemetry spans for finished requests, made from the native server's records after the fact.

The native server handles each request entirely in Rust and keeps, per request, its W3C trace context
(the client's `traceparent` joined, or a new trace id) and the wall-clock times of its phases. The
reporter (extproc.server) drains those records in batches; `SpanWriter.write` turns each into a span
tree with explicit start and end times, through opentelemetry-api only:

    extproc.request                  received .. finished   (child of the client's span, if it sent one)
      extproc.parse                  body .. parsed
      extproc.tokenize               parsed .. tokenized    (chat template and tokenizer)
      extproc.route                  tokenized .. routed
      extproc.engine_call            routed .. finished     (its id is the parent in the engine's traceparent)
        extproc.prefill              routed .. first_token
        extproc.decode               first_token .. finished

The engine call's `traceparent` names a span id Rust chose, so the engine-call span must get that id:
`PinnedIds`, the SDK id generator `configure` installs, hands it out (and a new trace's id). Under a
tracer provider the application set up itself the span tree is the same but the engine-call span (and a
new trace) get the SDK's own ids. Without the SDK, opentelemetry-api's no-op tracer makes nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

log = structlog.get_logger("extproc.request_traces")

TRACER_NAME = "extproc"
# OTEL_* variables that mean "export traces" (the SDK's own names).
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_wanted(setting: bool, env: Mapping[str, str] = os.environ) -> bool:
    """Tracing is on when the `tracing` setting says so or an OTLP endpoint is configured, unless the
    standard variables turn the SDK or trace export off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return setting or any(env.get(name) for name in _OTLP_ENDPOINTS)


try:  # The SDK is optional: without it, spans are opentelemetry-api's no-ops.
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class PinnedIds(IdGenerator):
        """The SDK's random ids, except the ones pinned for the span being started (per thread)."""

        def __init__(self) -> None:
            self._random = RandomIdGenerator()
            self._pinned = threading.local()

        @contextmanager
        def pinned(self, *, trace_id: int | None = None, span_id: int | None = None) -> Iterator[None]:
            """The next span started in this block gets these ids (each used once)."""
            self._pinned.trace_id, self._pinned.span_id = trace_id, span_id
            try:
                yield
            finally:
                self._pinned.trace_id = self._pinned.span_id = None

        def generate_trace_id(self) -> int:
            pinned = getattr(self._pinned, "trace_id", None)
            self._pinned.trace_id = None
            return pinned or self._random.generate_trace_id()

        def generate_span_id(self) -> int:
            pinned = getattr(self._pinned, "span_id", None)
            self._pinned.span_id = None
            return pinned or self._random.generate_span_id()

except ImportError:  # pragma: no cover - exercised only where the SDK is not installed
    PinnedIds = None  # type: ignore[assignment,misc]


def configure(env: Mapping[str, str] = os.environ) -> bool:
    """Install an SDK tracer provider exporting over OTLP (configured by the standard OTEL_* variables),
    unless the application already installed one. False when the SDK or an OTLP exporter is missing:
    the spans are then no-ops."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return True  # someone set a provider up already (e.g. `opentelemetry-instrument`)
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing is on but opentelemetry-sdk is not installed: no spans are exported")
        return False
    exporter = _otlp_exporter(env)
    if exporter is None:
        log.warning("tracing is on but no OTLP exporter package is installed: no spans are exported")
        return False
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "extproc"}
    provider = TracerProvider(id_generator=PinnedIds(), resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    try:
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    return OTLPSpanExporter()


def _operation(path: str) -> str:
    """GenAI semantic conventions' operation name for an API path."""
    if path.rstrip("/").endswith("chat/completions"):
        return "chat"
    if path.rstrip("/").endswith("completions"):
        return "text_completion"
    return path


class SpanWriter:
    """Writes the span tree of each finished request's record (a `take_summaries` dict)."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        provider = provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer(TRACER_NAME)
        ids = getattr(provider, "id_generator", None)
        self._ids = ids if PinnedIds is not None and isinstance(ids, PinnedIds) else None

    def _pinned(self, trace_id: int | None = None, span_id: int | None = None) -> Any:
        if self._ids is None:
            return _nothing()
        return self._ids.pinned(trace_id=trace_id, span_id=span_id)

    def write(self, record: Mapping[str, Any]) -> None:
        ctx = record.get("trace")
        times: Mapping[str, int] = record.get("timings_ns", {})
        if not ctx or "received" not in times or "finished" not in times:
            return
        trace_id = int(ctx["trace_id"], 16)
        flags = TraceFlags(TraceFlags.SAMPLED if ctx["sampled"] else TraceFlags.DEFAULT)
        parent = None
        if ctx.get("parent_span_id"):
            remote = SpanContext(trace_id, int(ctx["parent_span_id"], 16), is_remote=True, trace_flags=flags)
            parent = trace.set_span_in_context(NonRecordingSpan(remote))
        status = int(record.get("status", 0))
        attributes = {
            "http.route": record.get("path", ""),
            "http.response.status_code": status,
            "gen_ai.operation.name": _operation(str(record.get("path", ""))),
            "gen_ai.request.model": record.get("model", ""),
            "gen_ai.usage.input_tokens": int(record.get("prompt_tokens", 0)),
            "gen_ai.usage.output_tokens": int(record.get("completion_tokens", 0)),
            "extproc.request_id": record.get("request_id", ""),
            "extproc.engine_request_id": record.get("engine_request_id", ""),
            "extproc.cached_tokens": int(record.get("cached_tokens", 0)),
        }
        if record.get("finish_reason"):
            attributes["gen_ai.response.finish_reasons"] = [record["finish_reason"]]
        with self._pinned(trace_id=None if parent else trace_id):
            root = self._tracer.start_span(
                "extproc.request",
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                start_time=times["received"],
            )
        if status >= 500 or record.get("aborted"):
            root.set_status(Status(StatusCode.ERROR, record.get("error") or "client went away"))
        under_root = trace.set_span_in_context(root)
        for name, start, end in (
            ("extproc.parse", "body", "parsed"),
            ("extproc.tokenize", "parsed", "tokenized"),
            ("extproc.route", "tokenized", "routed"),
        ):
            if start in times and end in times:
                span = self._tracer.start_span(name, context=under_root, start_time=times[start])
                span.end(end_time=times[end])
        if "routed" in times:
            self._engine_call(record, ctx, times, under_root)
        root.end(end_time=times["finished"])

    def _engine_call(
        self, record: Mapping[str, Any], ctx: Mapping[str, Any], times: Mapping[str, int], parent: Any
    ) -> None:
        with self._pinned(span_id=int(ctx["engine_span_id"], 16)):
            call = self._tracer.start_span(
                "extproc.engine_call",
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={"server.address": record.get("endpoint", ""), "rpc.system": "grpc"},
                start_time=times["routed"],
            )
        if record.get("error") and int(record.get("status", 0)) >= 500:
            call.set_status(Status(StatusCode.ERROR, record["error"]))
        under_call = trace.set_span_in_context(call)
        end = times["finished"]
        first = times.get("first_token")
        prefill = self._tracer.start_span("extproc.prefill", context=under_call, start_time=times["routed"])
        prefill.end(end_time=first or end)
        if first is not None:
            decode = self._tracer.start_span("extproc.decode", context=under_call, start_time=first)
            decode.end(end_time=end)
        call.end(end_time=end)


@contextmanager
def _nothing() -> Iterator[None]:
    yield
