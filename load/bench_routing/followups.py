"""Where a session's follow-up turns found their history: the per-turn view behind a hit rate.

A turn re-sends its session's previous prompt plus the answer and a new message, so the engine that
served the previous turn holds that prompt's full blocks (unless it evicted them): a follow-up can hit
at least `reachable` = the previous prompt's tokens rounded down to whole blocks there. From each
request's spec (session key, messages) and the engine-reported cached tokens:

- `kept`: cached >= reachable - one block: it reached an engine holding its history;
- `lost`: cached < reachable / 2: it went elsewhere (or the history was evicted);
- `partial`: in between (part of the history evicted, or a shared prefix found elsewhere);
- `overlapped`: it was sent before the previous turn's first token (open loop), when the history is
  not cached anywhere yet;
- `lost_points`: the follow-ups' missing reachable tokens as points of the run's hit rate (what the
  gateway left on the table by not following the history, evictions included);
- `first_turn_share`: first turns' share of the measured prompt tokens. They cannot hit their own
  history, so a run that reaches more new sessions in the window (a faster gateway in closed loop) has
  a lower hit rate with the same routing: compare `kept` and `lost_points`, not only hit rates;
- `ttft_first_ms`, `ttft_followup_ms`: mean TTFT of first turns and of follow-ups (where the time goes).

Single-turn shapes have no follow-ups (`followups` 0, `first_turn_share` 1).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from load.loadgen.records import Record
from load.loadgen.workloads import ChatSpec


def analyse(turns: Sequence[tuple[ChatSpec, Record]], warmup_s: float, block_size: int) -> dict[str, Any]:
    """The follow-up breakdown of the requests started after `warmup_s` (module doc)."""
    by_session: dict[str, list[tuple[ChatSpec, Record]]] = defaultdict(list)
    for spec, record in turns:
        user = getattr(spec, "user", "")
        if user:
            by_session[user].append((spec, record))
    counts = {"kept": 0, "partial": 0, "lost": 0, "overlapped": 0}
    missing = 0
    firsts: set[int] = set()
    for session in by_session.values():
        session.sort(key=lambda pair: len(pair[0].messages))
        firsts.add(id(session[0][1]))
        for (_, prev), (_, rec) in itertools.pairwise(session):
            if rec.start < warmup_s or not (rec.ok and prev.ok) or not prev.prompt_tokens:
                continue
            if prev.ttft is None or rec.start < prev.start + prev.ttft:
                counts["overlapped"] += 1
                continue
            reachable = prev.prompt_tokens // block_size * block_size
            cached = rec.cached_tokens or 0
            if cached >= reachable - block_size:
                counts["kept"] += 1
            else:
                counts["lost" if cached < reachable / 2 else "partial"] += 1
                missing += reachable - cached
    measured = [r for _, r in turns if r.start >= warmup_s and r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in measured)
    judged = counts["kept"] + counts["partial"] + counts["lost"]
    out: dict[str, Any] = {"followups": judged + counts["overlapped"], "overlapped": counts["overlapped"]}
    for key in ("kept", "partial", "lost"):
        out[key] = counts[key] / judged if judged else None
    out["lost_points"] = 100 * missing / prompt if prompt else None
    first = [r for r in measured if id(r) in firsts]
    rest = [r for r in measured if id(r) not in firsts]
    out["first_turn_share"] = sum(r.prompt_tokens or 0 for r in first) / prompt if prompt else None
    out["ttft_first_ms"] = _mean_ms(first)
    out["ttft_followup_ms"] = _mean_ms(rest)
    return out


def _mean_ms(records: Sequence[Record]) -> float | None:
    ttfts = [r.ttft for r in records if r.ttft is not None]
    return 1000 * sum(ttfts) / len(ttfts) if ttfts else None
