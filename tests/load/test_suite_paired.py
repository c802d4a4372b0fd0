"""The request-by-request comparison of two runs of one point (load/bench_routing/paired.py) on records
written as the suite writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load.bench_routing import paired


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(
    session: str, messages: int, start: float, ttft: float, cached: int, error: str | None = None
) -> dict:
    return {
        "start": start,
        "ttft": None if error else ttft,
        "latency": ttft + 1,
        "error": error,
        "prompt_tokens": 1000,
        "cached_tokens": cached,
        "session": session,
        "messages": messages,
    }


def test_twins_are_matched_by_session_and_turn_after_the_warmup(tmp_path: Path) -> None:
    ours = write(
        tmp_path / "a.jsonl",
        [
            row("s1", 2, 1.0, 0.50, 0),  # warm-up: dropped
            row("s1", 4, 9.0, 0.30, 800),  # a follow-up 100 ms slower, 800 fewer cached tokens
            row("s2", 2, 9.5, 0.11, 0),  # a first turn 10 ms slower
            row("s3", 2, 10.0, 0.20, 0),  # failed in B: no twin
            row("s4", 2, 11.0, 0.0, 0, error="503"),  # failed in A: no twin
        ],
    )
    smg = write(
        tmp_path / "b.jsonl",
        [
            row("s2", 2, 9.5, 0.10, 0),
            row("s1", 4, 9.0, 0.20, 1600),
            row("s1", 2, 1.0, 0.40, 0),
            row("s3", 2, 10.0, 0.0, 0, error="503"),
            row("s4", 2, 11.0, 0.1, 0),
        ],
    )
    twins = paired.pair(paired.read_records(ours), paired.read_records(smg), after_s=8.0)
    assert [(t.session, t.messages) for t in twins] == [("s1", 4), ("s2", 2)]
    # s1's first turn fell in the warm-up; its turn 4 is still not its first.
    assert [t.first_turn for t in twins] == [False, True]
    s = paired.summary(twins)
    assert s["requests"] == 2
    assert round(s["mean_ms"], 6) == 55.0 and round(s["median_ms"], 6) == 55.0
    assert s["a_slower_share"] == 0.5 and s["b_slower_share"] == 0.0
    assert s["cached_diff_mean"] == -400
    table = paired.report(twins, worst=1)
    assert "| follow-ups | 1 | +100.0 |" in table
    assert "| same cached tokens | 1 | +10.0 |" in table
    assert "| 9.00 | s1 | 4 | 300 | 200 | 800 | 1600 |" in table


def test_closed_loop_hits_compare_over_the_requests_both_served(tmp_path: Path) -> None:
    # A faster gateway reaches later sessions in its window. Over its own requests it hits less (two
    # first turns, nothing to hit yet), though on every request both served it hit as much.
    ours = paired.read_records(
        write(
            tmp_path / "a.jsonl",
            [
                row("s1", 4, 5.0, 0.1, 900),
                row("s2", 2, 6.0, 0.1, 300),
                row("s3", 2, 7.0, 0.1, 0),
                row("s4", 2, 8.0, 0.1, 0),
            ],
        )
    )
    smg = paired.read_records(
        write(
            tmp_path / "b.jsonl",
            [row("s1", 2, 1.0, 0.3, 0), row("s1", 4, 6.0, 0.3, 900), row("s2", 2, 7.0, 0.3, 100)],
        )
    )
    twins = paired.twin_hits(ours, smg, after_s=4.0)
    assert twins["requests"] == 2, "s1's first turn is in SMG's warm-up; s3 and s4 only in ours"
    assert twins["pts"] == pytest.approx((1200 - 1000) / 2000 * 100)
    # Nothing in common: no figure rather than a zero.
    assert paired.twin_hits(ours, smg, after_s=100.0) == {"requests": 0, "a": None, "b": None, "pts": None}
