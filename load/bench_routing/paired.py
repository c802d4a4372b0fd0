"""Two runs of one open-loop point compared request by request.

The suite gives every gateway of a point the same arrivals and prompts, so each request of one run has its
twin in the other (same session, same turn). A difference of means mixes where the time went with which
requests were unlucky; pairing shows whether a gateway is slower on most requests or on a few, on first
turns or on follow-ups, and with what cache hits:

    python -m load.bench_routing.paired OURS/records.jsonl SMG/records.jsonl --after 8 --worst 10

(`records.jsonl` is in each run's log directory, `suite-<time>-logs/<cell>/<run>/`; `--after` drops the
warm-up, in seconds from the run's start, as the suite's own figures do.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A difference larger than this counts as a request that one gateway made wait (a prefill of a few hundred
# tokens on the simulated engines; well above the run-to-run jitter of a request served alike).
SLOWER_MS = 50.0

# A run's successful requests by (session, messages).
Records = dict[tuple[str, int], dict]


@dataclass(frozen=True)
class Twin:
    session: str
    messages: int
    start: float
    ttft_a: float
    ttft_b: float
    cached_a: int
    cached_b: int
    first_turn: bool
    # Where each went (records of suites since session 35): "e<engine> <held>/<best held>" tokens.
    where_a: str = ""
    where_b: str = ""

    @property
    def diff_ms(self) -> float:
        return (self.ttft_a - self.ttft_b) * 1000


def read_records(path: Path) -> Records:
    """A run's successful requests by (session, messages): one request of a session per turn."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        (r["session"], r["messages"]): r for r in rows if r.get("error") is None and r.get("ttft") is not None
    }


def pair(a: Records, b: Records, after_s: float = 0.0) -> list[Twin]:
    """The requests both runs served, started at or after `after_s` in run A, in A's start order."""
    firsts: dict[str, int] = {}
    for session, messages in a:
        firsts[session] = min(messages, firsts.get(session, messages))
    twins = [
        Twin(
            session=key[0],
            messages=key[1],
            start=ra["start"],
            ttft_a=ra["ttft"],
            ttft_b=b[key]["ttft"],
            cached_a=ra.get("cached_tokens") or 0,
            cached_b=b[key].get("cached_tokens") or 0,
            first_turn=key[1] == firsts[key[0]],
            where_a=_where(ra),
            where_b=_where(b[key]),
        )
        for key, ra in a.items()
        if key in b and ra["start"] >= after_s
    ]
    return sorted(twins, key=lambda t: t.start)


def _where(row: dict) -> str:
    """The engine a request reached and its cached prefix there against the best engine's, in tokens
    at arrival (`placement.py`); empty for records without them."""
    if row.get("engine") is None:
        return ""
    return f"e{row['engine']} {row['held_tokens']}/{row['best_held_tokens']}"


def twin_hits(a: Records, b: Records, after_s: float) -> dict[str, Any]:
    """Hit rates over the requests both runs served that started at or after `after_s` in each: the
    same prompts, so their difference is the routing's alone. In a closed loop the runs' own hit
    rates are over different requests: a faster gateway reaches other sessions and turns in the
    window, and a turn's share of cached tokens depends on which it is."""
    keys = [k for k, r in a.items() if k in b and r["start"] >= after_s and b[k]["start"] >= after_s]
    prompt_a = sum(a[k]["prompt_tokens"] for k in keys)
    prompt_b = sum(b[k]["prompt_tokens"] for k in keys)
    if not keys or not prompt_a or not prompt_b:
        return {"requests": len(keys), "a": None, "b": None, "pts": None}
    hit_a = sum(a[k].get("cached_tokens") or 0 for k in keys) / prompt_a
    hit_b = sum(b[k].get("cached_tokens") or 0 for k in keys) / prompt_b
    return {"requests": len(keys), "a": hit_a, "b": hit_b, "pts": 100 * (hit_a - hit_b)}


def summary(twins: Sequence[Twin]) -> dict[str, float | int | None]:
    """A minus B, per request: median and mean TTFT difference (ms), the share of requests more than
    SLOWER_MS slower in each, and the mean difference in cached tokens."""
    if not twins:
        return {"requests": 0}
    diffs = [t.diff_ms for t in twins]
    return {
        "requests": len(twins),
        "median_ms": statistics.median(diffs),
        "mean_ms": statistics.fmean(diffs),
        "a_slower_share": sum(d > SLOWER_MS for d in diffs) / len(diffs),
        "b_slower_share": sum(d < -SLOWER_MS for d in diffs) / len(diffs),
        "cached_diff_mean": statistics.fmean(t.cached_a - t.cached_b for t in twins),
    }


def report(twins: Sequence[Twin], worst: int) -> str:
    lines = [
        "| requests | n | median A-B ms | mean A-B ms | A slower | B slower | cached A-B (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups = [
        ("all", twins),
        ("first turns", [t for t in twins if t.first_turn]),
        ("follow-ups", [t for t in twins if not t.first_turn]),
        # Equal hits: what is left is queueing and the gateway's own time, not where the prefix was.
        ("same cached tokens", [t for t in twins if t.cached_a == t.cached_b]),
    ]
    for name, group in groups:
        s = summary(group)
        if not s["requests"]:
            lines.append(f"| {name} | 0 | | | | | |")
            continue
        lines.append(
            f"| {name} | {s['requests']} | {s['median_ms']:+.1f} | {s['mean_ms']:+.1f} | "
            f"{s['a_slower_share']:.0%} | {s['b_slower_share']:.0%} | {s['cached_diff_mean']:+.0f} |"
        )
    if worst:
        lines += [
            "",
            f"Worst {worst} for A (largest A-B):",
            "",
            "| start s | session | messages | TTFT A ms | TTFT B ms | cached A | cached B "
            "| A at: held/best | B at |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for t in sorted(twins, key=lambda t: t.diff_ms, reverse=True)[:worst]:
            lines.append(
                f"| {t.start:.2f} | {t.session} | {t.messages} | {t.ttft_a * 1000:.0f} "
                f"| {t.ttft_b * 1000:.0f} | {t.cached_a} | {t.cached_b} | {t.where_a} | {t.where_b} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m load.bench_routing.paired",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("a", type=Path, help="run A's records.jsonl (ours)")
    parser.add_argument("b", type=Path, help="run B's records.jsonl (the anchor), same point and arrivals")
    parser.add_argument("--after", type=float, default=0.0, help="only requests started after this (s)")
    parser.add_argument("--worst", type=int, default=10, help="list the N requests A served worst against B")
    args = parser.parse_args(argv)
    a, b = read_records(args.a), read_records(args.b)
    twins = pair(a, b, args.after)
    unmatched = sum(1 for key, r in a.items() if r["start"] >= args.after and key not in b)
    print(report(twins, args.worst))
    if unmatched:
        print(f"\n{unmatched} requests of A have no twin in B (failed there, or not the same arrivals)")


if __name__ == "__main__":
    main()
