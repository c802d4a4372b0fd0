"""Where a run's requests went, against where their prompts were cached when they arrived.

The simulator's request log (`extproc/simulator/request_log.py`) holds, per request, the engine it
reached and how many leading blocks of its prompt every engine had cached at that moment. From it:

- `held_pts`: prompt tokens cached on the engine each request reached (at arrival), per 100 prompt
  tokens; `best_pts`: the same on the best-holding engine; `missed_pts` their difference, the hit a
  router left on the table. The hit rate a run reports is measured later, when the engine schedules the
  request (a prefix another request is prefilling there is cached by then), so it differs from
  `held_pts`.
- `missed_idle_pts`: the part of `missed_pts` where some best holder had no prompt work left (nothing
  queued, no prefill running: the router had no load reason to go elsewhere); `missed_busy_pts`: every
  best holder was prefilling (logs without `prefill` judge by the queue alone).

And per request (`match`): the engine, its held blocks and the best held, joined to the load
generator's records by prompt length and time.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Seconds of slack when joining a record to its log line: the two clocks are read a few ms apart.
CLOCK_SLACK_S = 0.05


@dataclass(frozen=True)
class Arrival:
    t: float  # wall time the engine admitted the request
    engine: int
    prompt: int
    block: int
    held: tuple[int, ...]  # leading blocks of the prompt cached per engine
    waiting: tuple[int, ...]
    prefill: tuple[int, ...] | None = None  # prompt tokens each engine had left to compute

    @property
    def held_here(self) -> int:
        return self.held[self.engine]

    @property
    def best(self) -> int:
        return max(self.held)

    @property
    def holder_idle(self) -> bool:
        """Some engine holding the best prefix had no prompt work left (or, in logs without it, no queue)."""
        best = self.best
        work = self.prefill if self.prefill is not None else self.waiting
        return any(h == best and w == 0 for h, w in zip(self.held, work, strict=True))


def read_log(path: Path) -> list[Arrival]:
    """The log's requests in arrival order (none when the file is missing)."""
    if not path.exists():
        return []
    arrivals = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        arrivals.append(
            Arrival(
                t=row["t"],
                engine=row["engine"],
                prompt=row["prompt"],
                block=row["block"],
                held=tuple(row["held"]),
                waiting=tuple(row["waiting"]),
                prefill=tuple(row["prefill"]) if "prefill" in row else None,
            )
        )
    return sorted(arrivals, key=lambda a: a.t)


def summarize(arrivals: Sequence[Arrival], since: float) -> dict[str, Any]:
    """Held, best and missed prefix tokens per 100 prompt tokens, over requests admitted at or after
    `since` (wall time); `missed_requests`: how many reached an engine holding fewer blocks than the best."""
    window = [a for a in arrivals if a.t >= since]
    prompt = sum(a.prompt for a in window)
    if not prompt:
        return {"requests": len(window)}
    held = sum(a.held_here * a.block for a in window)
    best = sum(a.best * a.block for a in window)
    missed = [a for a in window if a.best > a.held_here]
    idle = sum((a.best - a.held_here) * a.block for a in missed if a.holder_idle)
    return {
        "requests": len(window),
        "held_pts": 100 * held / prompt,
        "best_pts": 100 * best / prompt,
        "missed_pts": 100 * (best - held) / prompt,
        "missed_idle_pts": 100 * idle / prompt,
        "missed_busy_pts": 100 * (best - held - idle) / prompt,
        "missed_requests": len(missed),
    }


def match(rows: Sequence[dict[str, Any]], arrivals: Sequence[Arrival], wall0: float) -> list[Arrival | None]:
    """Each record's log line, or None: the earliest unclaimed line with the record's prompt length
    admitted between its start and its first token (`wall0`: the wall time of the records' zero). A
    request that failed before its first token is matched only if the engine saw it at its start."""
    times = [a.t for a in arrivals]
    claimed: set[int] = set()
    out: list[Arrival | None] = []
    for row in rows:
        found = None
        if row.get("prompt_tokens") is not None:
            lo = wall0 + row["start"] - CLOCK_SLACK_S
            hi = wall0 + row["start"] + (row.get("ttft") or 0.0) + CLOCK_SLACK_S
            for i in range(bisect.bisect_left(times, lo), bisect.bisect_right(times, hi)):
                if i not in claimed and arrivals[i].prompt == row["prompt_tokens"]:
                    found = i
                    break
        if found is not None:
            claimed.add(found)
        out.append(arrivals[found] if found is not None else None)
    return out


def annotate(rows: list[dict[str, Any]], arrivals: Sequence[Arrival], wall0: float) -> None:
    """Adds `engine`, `held_tokens` and `best_held_tokens` to each record row its log line was found for."""
    for row, arrival in zip(rows, match(rows, arrivals, wall0), strict=True):
        if arrival is not None:
            row["engine"] = arrival.engine
            row["held_tokens"] = arrival.held_here * arrival.block
            row["best_held_tokens"] = arrival.best * arrival.block
