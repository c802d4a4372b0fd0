"""Where a run's requests went against where their prompts were cached (load/bench_routing/placement.py),
on request logs written as the simulator writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load.bench_routing import paired, placement

WALL0 = 1_000_000.0  # the records' zero, in wall time


def line(t: float, engine: int, prompt: int, held: list[int], waiting: list[int]) -> dict:
    return {
        "t": WALL0 + t,
        "engine": engine,
        "rank": 0,
        "id": f"r{t}",
        "prompt": prompt,
        "block": 16,
        "held": held,
        "waiting": waiting,
        "running": [0] * len(held),
    }


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_missed_prefix_splits_by_whether_a_holder_was_idle(tmp_path: Path) -> None:
    log = write(
        tmp_path / "requests.jsonl",
        [
            line(1.0, 0, 1000, [0, 0], [0, 0]),  # warm-up: left out
            line(9.0, 1, 1000, [40, 10], [0, 0]),  # 30 blocks missed, the holder idle
            line(9.5, 0, 1000, [20, 50], [0, 3]),  # 30 blocks missed, the only holder queued
            line(10.0, 0, 1000, [50, 50], [2, 0]),  # no miss: it reached a best holder
        ],
    )
    s = placement.summarize(placement.read_log(log), since=WALL0 + 8.0)
    assert s["requests"] == 3
    assert s["missed_requests"] == 2
    assert s["held_pts"] == pytest.approx(100 * (10 + 20 + 50) * 16 / 3000)
    assert s["best_pts"] == pytest.approx(100 * (40 + 50 + 50) * 16 / 3000)
    assert s["missed_pts"] == pytest.approx(100 * 60 * 16 / 3000)
    assert s["missed_idle_pts"] == pytest.approx(100 * 30 * 16 / 3000)
    assert s["missed_busy_pts"] == pytest.approx(100 * 30 * 16 / 3000)


def test_a_tie_for_best_counts_idle_if_any_best_holder_is() -> None:
    arrival = placement.Arrival(t=0, engine=2, prompt=500, block=16, held=(9, 9, 0), waiting=(4, 0, 0))
    assert arrival.holder_idle
    busy = placement.Arrival(t=0, engine=2, prompt=500, block=16, held=(9, 9, 0), waiting=(4, 1, 0))
    assert not busy.holder_idle


def test_an_empty_or_missing_log_summarizes_to_no_requests(tmp_path: Path) -> None:
    assert placement.read_log(tmp_path / "absent.jsonl") == []
    assert placement.summarize([], since=0.0) == {"requests": 0}


def test_records_join_their_log_lines_by_prompt_length_within_their_wait() -> None:
    arrivals = [
        placement.Arrival(WALL0 + 2.02, 1, 700, 16, (5, 0), (0, 0)),
        placement.Arrival(WALL0 + 2.03, 0, 900, 16, (0, 0), (0, 0)),
        placement.Arrival(WALL0 + 2.04, 0, 700, 16, (5, 0), (0, 0)),
        placement.Arrival(WALL0 + 7.00, 1, 300, 16, (0, 2), (0, 0)),
    ]
    rows = [
        {"start": 2.0, "ttft": 0.3, "prompt_tokens": 700},
        {"start": 2.01, "ttft": 0.3, "prompt_tokens": 700},  # the second 700: the next unclaimed line
        {"start": 2.0, "ttft": 0.5, "prompt_tokens": 900},
        {"start": 3.0, "ttft": 0.1, "prompt_tokens": 300},  # its line came 4 s later: not this one
        {"start": 4.0, "ttft": None, "prompt_tokens": None, "error": "503"},
    ]
    placement.annotate(rows, arrivals, WALL0)
    assert [(r.get("engine"), r.get("held_tokens"), r.get("best_held_tokens")) for r in rows] == [
        (1, 0, 80),
        (0, 80, 80),
        (0, 0, 0),
        (None, None, None),
        (None, None, None),
    ]


def test_paired_worst_list_shows_where_each_twin_went(tmp_path: Path) -> None:
    base = {"start": 9.0, "latency": 1.0, "error": None, "prompt_tokens": 1000, "session": "s1"}
    base["messages"] = 2
    where = {"engine": 3, "held_tokens": 0, "best_held_tokens": 960}
    a = write(tmp_path / "a.jsonl", [{**base, "ttft": 0.5, "cached_tokens": 0, **where}])
    b = write(tmp_path / "b.jsonl", [{**base, "ttft": 0.1, "cached_tokens": 960}])  # an old record
    twins = paired.pair(paired.read_records(a), paired.read_records(b))
    assert (twins[0].where_a, twins[0].where_b) == ("e3 0/960", "")
    assert "| e3 0/960 |  |" in paired.report(twins, worst=1)


def test_the_report_shows_each_runs_missed_prefix_beside_its_hits() -> None:
    from load.bench_routing import suite_report

    def run(gateway: str, placed: dict | None) -> dict:
        out = {
            "gateway": gateway,
            "ttft_ms": {"mean": 100.0, "p90": 200.0, "p99": 200.0},
            "hit_rate": 0.8,
            "requests_per_s": 1.0,
            "served_max_over_mean": 1.0,
            "in_flight_max_over_mean": 1.0,
        }
        if placed is not None:
            out["placement"] = placed
        return out

    placed = {"requests": 90, "missed_pts": 4.31, "missed_idle_pts": 1.5, "missed_busy_pts": 2.81}
    runs = [run("smg", placed), run("kv_events", None)]
    point = {"mode": "closed", "load": None, "rate": None, "runs": runs}
    cell = {"shape": "zipf", "seed": 0, "sweep": "main", "engines": 4, "num_blocks": 1024, "points": [point]}
    header = suite_report.HEADER.splitlines()[0].split("|")[1:-1]
    lines = list(suite_report._rows(cell, {"default_policy": "kv_events"}))
    rows = [dict(zip(header, x.split("|")[1:-1], strict=True)) for x in lines]
    column = [r[" prefix missed pts (holder idle) "] for r in rows]
    assert column == [" 4.3 (1.5) ", " - "], "an older run recorded without placement shows none"


def test_a_holder_running_a_prefill_is_busy_though_nothing_waits() -> None:
    # A long prompt being prefilled is running on the engine, not queued: its queue reads empty.
    prefilling = placement.Arrival(
        t=0, engine=1, prompt=629, block=16, held=(33, 0), waiting=(0, 0), prefill=(1817, 0)
    )
    assert not prefilling.holder_idle
    done = placement.Arrival(
        t=0, engine=1, prompt=629, block=16, held=(33, 0), waiting=(0, 0), prefill=(0, 0)
    )
    assert done.holder_idle
