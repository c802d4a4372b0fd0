"""Drive a target: closed loop (N clients, each sends its next request when the last one finished) or open
loop (requests start at given times, Poisson or from a trace, however many are still in flight).

Closed loop measures capacity: with enough clients the target is saturated and the completion rate is
its maximum sustained throughput. Open loop measures latency at a chosen offered load, including the
queueing a closed loop hides (coordinated omission): a request's latency counts from its due time.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from load.loadgen.progress import Progress
from load.loadgen.records import Record, summarize, summarize_by_kind
from load.loadgen.workloads import ChatSpec


class Target(Protocol):
    def prepare(self, spec: ChatSpec) -> Any: ...

    async def send(self, prepared: Any, run_start: float) -> Record: ...


@dataclass
class RunResult:
    records: list[Record]
    wall_s: float

    def summary(self) -> dict[str, Any]:
        out = summarize(self.records, self.wall_s)
        if len({r.kind for r in self.records}) > 1:
            out["by_kind"] = summarize_by_kind(self.records, self.wall_s)
        return out


async def closed_loop(
    target: Target,
    prepared: Sequence[Any],
    concurrency: int,
    *,
    duration_s: float | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Send `prepared` in order from `concurrency` clients; stop early (no new requests) after duration_s."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    records: list[Record] = []
    next_index = 0
    start = time.perf_counter()
    deadline = start + duration_s if duration_s else None

    async def client() -> None:
        nonlocal next_index
        while next_index < len(prepared) and (deadline is None or time.perf_counter() < deadline):
            item = prepared[next_index]
            next_index += 1
            record = await target.send(item, start)
            records.append(record)
            if progress:
                progress.update(record.ok)

    await asyncio.gather(*(client() for _ in range(min(concurrency, len(prepared)) or 1)))
    wall = time.perf_counter() - start
    if progress:
        progress.close()
    return RunResult(records, wall)


async def open_loop(
    target: Target,
    prepared: Sequence[Any],
    arrivals: Sequence[float],
    *,
    progress: Progress | None = None,
) -> RunResult:
    """Start request i at `arrivals[i]` seconds after the start; latency includes any lateness."""
    records: list[Record] = []
    start = time.perf_counter()

    async def one(item: Any, due: float) -> None:
        record = await target.send(item, start)
        # The client fell behind (it is sharing the CPUs too): count the lag as waiting time.
        lag = max(0.0, record.start - due)
        record.latency += lag
        if record.ttft is not None:
            record.ttft += lag
        record.start = due
        records.append(record)
        if progress:
            progress.update(record.ok)

    tasks = []
    for item, due in zip(prepared, arrivals, strict=False):
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(item, due)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    if progress:
        progress.close()
    return RunResult(records, wall)


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> list[float]:
    """`count` arrival times (s) of a Poisson process of `rate` requests per second."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(f"arrivals:{seed}")
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def load_trace(path: Path) -> list[float]:
    """Arrival times from a file: one per line, seconds from the start, as a number or a JSON object with
    "t" (or "timestamp"); blank lines and lines starting with # are skipped. Sorted, shifted to start at 0."""
    times: list[float] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            value = json.loads(line)
            if isinstance(value, dict):
                value = value.get("t", value.get("timestamp"))
            times.append(float(value))
        except (ValueError, TypeError):
            raise ValueError(f"{path}:{n}: expected a time in seconds, got {line[:60]!r}") from None
    if not times:
        raise ValueError(f"{path} has no arrival times")
    times.sort()
    return [t - times[0] for t in times]


def prepare_all(target: Target, specs: Iterable[ChatSpec]) -> list[Any]:
    return [target.prepare(spec) for spec in specs]
