"""What one request measured, and the summary of many.

Times are seconds from `time.perf_counter()`. TTFT is the time to the first piece of generated text
(streams only: a non-streamed answer has no first token to time); inter-token latency is the gap between
consecutive pieces of a stream (one SSE event or one engine chunk each, usually one token).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class Record:
    kind: str
    stream: bool
    start: float  # seconds since the run started
    latency: float = math.nan  # end to end: request written -> last byte of the answer
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    status: int = 0  # HTTP status; 200 for a floor request that completed; 0: no response
    error: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    # The prompt's prefix-cache hit the server reported (usage.prompt_tokens_details.cached_tokens).
    cached_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def distribution(values: Iterable[float], scale: float = 1000.0) -> dict[str, float | int]:
    """count, mean and percentiles, scaled (default: seconds -> milliseconds)."""
    ordered = sorted(v * scale for v in values)
    out: dict[str, float | int] = {"count": len(ordered)}
    out["mean"] = sum(ordered) / len(ordered) if ordered else math.nan
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(ordered, p)
    out["max"] = ordered[-1] if ordered else math.nan
    return out


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """The numbers a run reports: throughput, latency distributions (ms), errors by cause."""
    ok = [r for r in records if r.ok]
    streams = [r for r in ok if r.stream]
    errors = Counter(_error_key(r) for r in records if not r.ok)
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "errors_by_cause": dict(errors.most_common()),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else math.nan,
        "prompt_tokens_mean": _mean(r.prompt_tokens for r in ok if r.prompt_tokens is not None),
        "output_tokens_mean": _mean(r.output_tokens for r in ok if r.output_tokens is not None),
        "latency_ms": distribution(r.latency for r in ok),
        "ttft_ms": distribution(r.ttft for r in streams if r.ttft is not None),
        "itl_ms": distribution(gap for r in streams for gap in r.itl),
    }


def summarize_by_kind(records: Sequence[Record], wall_s: float) -> dict[str, dict[str, Any]]:
    kinds = sorted({r.kind for r in records})
    return {k: summarize([r for r in records if r.kind == k], wall_s) for k in kinds}


def _error_key(record: Record) -> str:
    return f"HTTP {record.status}" if record.status else (record.error or "error").split(":", 1)[0]


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else math.nan


def json_safe(value: Any) -> Any:
    """NaN (an empty distribution) is not JSON: write null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
