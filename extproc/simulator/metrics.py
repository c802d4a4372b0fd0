"""Prometheus text exposition of one engine's state, under vLLM's metric names.

vLLM (v1) labels every series with `model_name` and `engine`; counters carry the `_total` suffix that
its prometheus_client adds. Only what the simulator really models is exported. With several DP ranks the
series are the engine's totals over its ranks (KV usage over all their blocks, one TTFT histogram), so a
benchmark reading `vllm:*` per engine sees the whole engine.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from extproc.simulator.core import EngineCore
    from extproc.simulator.scheduler import Scheduler

# vLLM's time-to-first-token buckets (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = TTFT_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    @classmethod
    def merged(cls, histograms: list[Histogram]) -> Histogram:
        """One histogram of every observation of several (with the same buckets)."""
        total = cls(histograms[0].buckets)
        for histogram in histograms:
            total.counts = [a + b for a, b in zip(total.counts, histogram.counts, strict=True)]
            total.sum += histogram.sum
            total.count += histogram.count
        return total


def _kv_usage(schedulers: list[Scheduler]) -> float:
    """Blocks held over all ranks' blocks (one rank: its own usage)."""
    used = sum(s.cache.used_blocks for s in schedulers)
    return used / sum(s.cache.num_blocks for s in schedulers)


def _labels(core: EngineCore, extra: str = "") -> str:
    name = core.spec.served_name.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{engine="0",model_name="{name}"{extra}}}'


def render(core: EngineCore) -> str:
    schedulers = core.schedulers
    stats = core.stats
    labels = _labels(core)
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_text: str, series: str = labels) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        lines.append(f"{name}{series} {value}")

    metric(
        "vllm:num_requests_running",
        "gauge",
        sum(len(s.running) for s in schedulers),
        "Number of requests in model execution batches.",
    )
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        sum(len(s.waiting) for s in schedulers),
        "Number of requests waiting to be processed.",
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        _kv_usage(schedulers),
        "KV-cache usage. 1 means 100 percent usage.",
    )
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        sum(s.stats.prompt_tokens for s in schedulers),
        "Prefix cache queries, in terms of number of queried tokens.",
    )
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        sum(s.stats.cached_tokens for s in schedulers),
        "Prefix cache hits, in terms of number of cached tokens.",
    )
    metric(
        "vllm:num_preemptions_total",
        "counter",
        sum(s.stats.preemptions for s in schedulers),
        "Cumulative number of preemptions.",
    )
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        sum(s.stats.prompt_tokens for s in schedulers),
        "Number of prefill tokens processed.",
    )
    metric(
        "vllm:generation_tokens_total",
        "counter",
        stats.output_tokens,
        "Number of generation tokens processed.",
    )
    lines.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    lines.append("# TYPE vllm:request_success counter")
    for reason in ("stop", "length", "abort"):
        series = _labels(core, f',finished_reason="{reason}"')
        lines.append(f"vllm:request_success_total{series} {core.finished[reason]}")

    ttft = Histogram.merged([s.stats.ttft for s in schedulers])
    name = "vllm:time_to_first_token_seconds"
    lines.append(f"# HELP {name} Histogram of time to first token in seconds.")
    lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, count in zip((*ttft.buckets, float("inf")), ttft.counts, strict=True):
        cumulative += count
        le = "+Inf" if bound == float("inf") else repr(bound)
        series = _labels(core, f',le="{le}"')
        lines.append(f"{name}_bucket{series} {cumulative}")
    lines.append(f"{name}_sum{labels} {ttft.sum}")
    lines.append(f"{name}_count{labels} {ttft.count}")
    return "\n".join(lines) + "\n"
