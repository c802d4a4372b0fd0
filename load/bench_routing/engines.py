"""The simulated engines of the routing benchmark, and what they report while a run goes on.

One `python -m extproc.simulator` process hosts the engines, started fresh for every run so that no run
inherits another's cache. Their time model makes prefill the cost that routing can save: a step with
prompt work costs a fixed overhead plus a time per uncached prompt token, so an uncached 3,000-token
prompt takes ~30x longer to its first token than one cached up to its last 60 tokens, and the KV cache
is small enough that the trace's shared prefixes do not all fit in one engine (see `EngineConfig`).

`EngineWatch` polls every engine's Prometheus `/metrics` during a run: requests in flight (running +
waiting; its peak per engine), and at the end the counters (requests served, prompt and cached tokens,
preemptions) less those at the start.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extproc.simulator.command import simulator_argv
from extproc.simulator.options import SimOptions
from load.bench.procs import Child, spawn, wait_for

_LISTENING = re.compile(r"engine (\d+) listening on (\S+) \(metrics on port (\d+)\)")
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\} (\S+)$", re.M)


@dataclass(frozen=True)
class EngineConfig:
    """Engine count, KV capacity and timing (milliseconds before `time_scale`)."""

    engines: int = 4
    block_size: int = 16
    # 1,024 blocks of 16 = 16,384 tokens per engine: the trace's shared prefixes (~37k tokens, see
    # trace.working_set_tokens) need 2.3 engines' caches; four hold them only if each keeps its share.
    num_blocks: int = 1024
    # Roughly an 8B model on one mid-range GPU: a step with prompt work costs 10 ms plus 0.25 ms per
    # uncached prompt token (4,000 prefill tokens/s); a decode-only step 25 ms, plus 0.25 ms per decoding
    # sequence in any step. An uncached 2,000-token prompt: ~0.5 s to its first token; cached but 60: ~25 ms.
    ttft_ms: float = 10.0
    prefill_ms_per_token: float = 0.25
    itl_ms: float = 25.0
    decode_ms_per_seq: float = 0.25
    max_num_batched_tokens: int = 4096
    # 1.0: the engines, not this machine's two CPUs, are the bottleneck (the capacity probe's
    # own_cpu_share says so), and a 50 s trace still carries ~420 requests.
    time_scale: float = 1.0

    def options(self) -> SimOptions:
        return SimOptions(
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            ttft_ms=self.ttft_ms,
            prefill_ms_per_token=self.prefill_ms_per_token,
            itl_ms=self.itl_ms,
            decode_ms_per_seq=self.decode_ms_per_seq,
            max_num_batched_tokens=self.max_num_batched_tokens,
            time_scale=self.time_scale,
        )

    def argv(self) -> list[str]:
        return simulator_argv(self.options(), engines=self.engines, metrics_port=0)

    def prefill_s(self, uncached_tokens: float) -> float:
        """Seconds of one prefill step over `uncached_tokens`, scaled."""
        return (self.ttft_ms + self.prefill_ms_per_token * uncached_tokens) * self.time_scale / 1000

    def zero_hit_capacity(self, mean_prompt_tokens: float) -> float:
        """Requests/s the engines sustain if nothing is ever cached and each prompt is prefilled in a
        step of its own (decode steps between them left out): the timing model's rough bound."""
        return self.engines / self.prefill_s(mean_prompt_tokens)

    @property
    def cache_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass
class Engines:
    child: Child
    addresses: list[str]
    metrics_ports: list[int]
    argv: list[str]

    def stop(self) -> None:
        self.child.stop()


def start_engines(
    config: EngineConfig, log_dir: Path, name: str = "engines", request_log: Path | None = None
) -> Engines:
    """The simulated engines of one run, as a child process logging under `log_dir`; `request_log`: where
    the simulator writes each request's engine and every engine's cached blocks of it (`placement.py`)."""
    argv = config.argv()
    if request_log is not None:
        argv += ["--request-log", str(request_log)]
    child = spawn(name, argv, log_dir)
    found: list[tuple[str, int]] = []

    def ready() -> bool:
        text = child.log.read_text(errors="replace")
        found[:] = [(m.group(2), int(m.group(3))) for m in _LISTENING.finditer(text)]
        return len(found) >= config.engines

    wait_for(child, ready, f"{config.engines} 'engine i listening' lines", timeout_s=60)
    return Engines(child, [a for a, _ in found], [p for _, p in found], argv)


async def http_get(port: int, path: str, timeout_s: float = 2.0) -> str:
    """A one-shot GET on 127.0.0.1 (the simulator's and SMG's metrics servers close after answering)."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        body = _dechunk(body)
    return body.decode(errors="replace")


def _dechunk(body: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = body.find(b"\r\n", pos)
        if end < 0:
            return bytes(out)
        size = int(body[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def parse_counters(text: str) -> dict[str, float]:
    """Sum of every `vllm:` series by name (the requests-served counter summed over finish reasons)."""
    out: dict[str, float] = {}
    for match in _SAMPLE.finditer(text):
        name, value = match.group(1), float(match.group(2))
        if name.startswith("vllm:time_to_first_token"):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class EngineWatch:
    """Samples each engine's in-flight requests every `interval_s` while running."""

    ports: list[int]
    interval_s: float = 0.2
    peaks: list[int] = field(default_factory=list)
    sums: list[int] = field(default_factory=list)
    samples: int = 0
    # Per engine, the monotonic time of the first sample that saw it busy (requests in flight, or more
    # served than at the start or at its `rewatch`); None while it has seen no request.
    first_busy: list[float | None] = field(default_factory=list)
    _served: list[float] = field(default_factory=list)  # the last sample's requests served
    _served_base: list[float] = field(default_factory=list)  # served before what first_busy watches
    start: list[dict[str, float]] = field(default_factory=list)
    end: list[dict[str, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _scrape(self) -> list[dict[str, float]]:
        texts = await asyncio.gather(*(http_get(p, "/metrics") for p in self.ports))
        return [parse_counters(t) for t in texts]

    async def __aenter__(self) -> EngineWatch:
        self.start = await self._scrape()
        self.peaks = [0] * len(self.ports)
        self.sums = [0] * len(self.ports)
        self.first_busy = [None] * len(self.ports)
        self._served = [c.get("vllm:request_success_total", 0.0) for c in self.start]
        self._served_base = list(self._served)
        self._task = asyncio.create_task(self._poll())
        return self

    async def _poll(self) -> None:
        next_at = time.monotonic()
        while True:
            try:
                scraped = await self._scrape()
            except (OSError, TimeoutError):
                scraped = []
            for i, counters in enumerate(scraped):
                flight = int(
                    counters.get("vllm:num_requests_running", 0)
                    + counters.get("vllm:num_requests_waiting", 0)
                )
                self.peaks[i] = max(self.peaks[i], flight)
                self.sums[i] += flight
                served = self._served[i] = counters.get("vllm:request_success_total", 0.0)
                if self.first_busy[i] is None and (flight or served > self._served_base[i]):
                    self.first_busy[i] = time.monotonic()
            if scraped:
                self.samples += 1
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def rewatch(self, engines: Iterable[int]) -> None:
        """Watch these engines for their first request anew, from now (after a restart)."""
        for i in engines:
            self.first_busy[i] = None
            self._served_base[i] = self._served[i]

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.end = await self._scrape()

    def report(self) -> dict[str, Any]:
        def delta(name: str) -> list[float]:
            return [e.get(name, 0.0) - s.get(name, 0.0) for s, e in zip(self.start, self.end, strict=True)]

        served = [int(v) for v in delta("vllm:request_success_total")]
        queried, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
        mean_served = sum(served) / len(served) if served else 0.0
        return {
            "served": served,
            "served_max_over_mean": max(served) / mean_served if mean_served else None,
            "peak_in_flight": self.peaks,
            "mean_in_flight": [s / self.samples for s in self.sums] if self.samples else [],
            "engine_hit_rate": [h / q if q else None for h, q in zip(hits, queried, strict=True)],
            "engine_prompt_tokens": [int(q) for q in queried],
            "engine_cached_tokens": [int(h) for h in hits],
            "engine_generated_tokens": [int(v) for v in delta("vllm:generation_tokens_total")],
            "preemptions": [int(v) for v in delta("vllm:num_preemptions_total")],
            "samples": self.samples,
        }
