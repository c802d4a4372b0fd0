"""One structured log line per finished request, from the native server's record (a `take_summaries`
dict): who asked (request id, API key name), what (path, model), where it went (engine), how it ended
(status, finish reason, error), its tokens and where its time went, in milliseconds.

The record holds no prompt or completion text (the native server never keeps it), so none is logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

log = structlog.get_logger("extproc.requests")

# (log field, phase start, phase end) over the record's `timings_ns`; a phase not reached is left out.
_PHASES = (
    ("parse_ms", "body", "parsed"),
    ("tokenize_ms", "parsed", "tokenized"),
    ("route_ms", "tokenized", "routed"),
    ("prefill_ms", "routed", "first_token"),
    ("decode_ms", "first_token", "finished"),
    ("ttft_ms", "received", "first_token"),
    ("total_ms", "received", "finished"),
)


def fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The log line's fields."""
    out: dict[str, Any] = {
        "request_id": record.get("request_id", ""),
        "engine_request_id": record.get("engine_request_id", ""),
        "path": record.get("path", ""),
        "model": record.get("model", ""),
        "engine": record.get("endpoint", ""),
        "status": record.get("status", 0),
        "prompt_tokens": record.get("prompt_tokens", 0),
        "completion_tokens": record.get("completion_tokens", 0),
        "cached_tokens": record.get("cached_tokens", 0),
        "finish_reason": record.get("finish_reason", ""),
        "aborted": record.get("aborted", False),
    }
    for optional in ("error", "api_key", "objective", "dp_rank"):
        if record.get(optional) not in (None, ""):
            out[optional] = record[optional]
    times: Mapping[str, int] = record.get("timings_ns", {})
    for name, start, end in _PHASES:
        if start in times and end in times:
            out[name] = round((times[end] - times[start]) / 1e6, 3)
    ctx = record.get("trace")
    if ctx:
        out["trace_id"] = ctx["trace_id"]
    return out


def log_request(record: Mapping[str, Any]) -> None:
    """Log the finished request: at error level for a 5xx, else info."""
    status = int(record.get("status", 0))
    (log.error if status >= 500 else log.info)("request", **fields(record))
