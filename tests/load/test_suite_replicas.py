"""The suite's replica runs and per-turn analysis (load/bench_routing/replicas.py, followups.py, target.py):
Envoy's ext_proc cluster lists every replica, requests are split over front doors as documented, the
follow-up classification tells a turn that found its history from one that did not, and the report's
replica section compares each topology with its one-replica run."""

from __future__ import annotations

from extproc.envoy_bootstrap import EXTPROC_CLUSTER
from load.bench_routing import followups, suite_report
from load.bench_routing.replicas import envoy_bootstrap
from load.bench_routing.target import SplitTarget
from load.bench_routing.trace import RoutedSpec
from load.loadgen.records import Record
from load.loadgen.text import Text
from load.loadgen.workloads import Message


def test_one_envoy_balances_ext_proc_over_every_replica() -> None:
    config = envoy_bootstrap([50001, 50002], 8080, 9901)
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == EXTPROC_CLUSTER)
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert ports == [50001, 50002]
    assert cluster.get("lb_policy", "ROUND_ROBIN") == "ROUND_ROBIN"


def _spec(user: str, turns: int) -> RoutedSpec:
    messages = tuple(Message("user", Text("x", (1,) * 10)) for _ in range(turns))
    return RoutedSpec("sessions", messages, 8, True, user=user, shares="-")


def test_split_target_alternates_doors_or_keeps_a_clients_door() -> None:
    target = SplitTarget(["http://127.0.0.1:1", "http://127.0.0.1:2"], "m")
    try:
        doors = [target.prepare(_spec("u", 1))[1] for _ in range(4)]
        assert doors == [0, 1, 0, 1]
        assert [target.prepare(_spec("u", 1), via=k)[1] for k in (3, 3, 4)] == [1, 1, 0]
    finally:
        target.close()


def _rec(start: float, prompt: int, cached: int, ttft: float = 0.1) -> Record:
    return Record(
        "sessions",
        True,
        start,
        latency=0.5,
        ttft=ttft,
        status=200,
        prompt_tokens=prompt,
        cached_tokens=cached,
    )


def test_followups_tell_kept_history_from_lost() -> None:
    turns = [
        # Session a: turn 2 hit its whole first prompt (320 tokens = 20 blocks), turn 3 found nothing.
        (_spec("a", 1), _rec(0.0, 320, 0)),
        (_spec("a", 2), _rec(1.0, 640, 320)),
        (_spec("a", 3), _rec(2.0, 960, 16)),
        # Session b: turn 2 was sent before turn 1's first token, so nothing was reachable yet.
        (_spec("b", 1), _rec(0.0, 320, 0, ttft=0.5)),
        (_spec("b", 2), _rec(0.2, 640, 0)),
    ]
    out = followups.analyse(turns, warmup_s=0.0, block_size=16)
    assert (out["followups"], out["overlapped"]) == (3, 1)
    assert (out["kept"], out["lost"], out["partial"]) == (0.5, 0.5, 0.0)
    # Turn 3 missed 640 - 16 reachable tokens out of 2,880 measured prompt tokens.
    assert abs(out["lost_points"] - 100 * 624 / 2880) < 1e-9
    assert abs(out["first_turn_share"] - 640 / 2880) < 1e-9


def _run(name: str, hit: float, mean: float) -> dict[str, object]:
    return {"gateway": name, "hit_rate": hit, "ttft_ms": {"mean": mean, "p90": mean}}


def test_replica_rows_compare_with_the_one_replica_run_and_smg_pair() -> None:
    doc = {
        "replicas": [
            {"name": "smg_x2", "topology": "smg_x2", "baseline": "smg"},
            {"name": "kv_events_envoy_x2", "topology": "envoy_x2", "baseline": "kv_events"},
        ],
        "cells": [
            {
                "shape": "sessions",
                "seed": 0,
                "points": [
                    {
                        "mode": "closed",
                        "load": None,
                        "runs": [
                            _run("smg", 0.80, 100.0),
                            _run("kv_events", 0.80, 80.0),
                            _run("smg_x2", 0.70, 200.0),
                            _run("kv_events_envoy_x2", 0.795, 100.0),
                        ],
                    }
                ],
            }
        ],
    }
    rows = {r["gateway"]: r for r in suite_report.replica_rows(doc)}
    ours = rows["kv_events_envoy_x2"]
    assert abs(ours["hit_vs_one_pts"] + 0.5) < 1e-9
    assert ours["mean_vs_one"] == 1.25 and ours["mean_vs_smg_x2"] == 0.5
    assert abs(rows["smg_x2"]["hit_vs_one_pts"] + 10) < 1e-9 and rows["smg_x2"]["mean_vs_smg_x2"] is None
    text = "\n".join(suite_report.replicas_markdown(doc))
    assert "kv_events_envoy_x2**: worst hit rate vs kv_events -0.5 pts (sessions s0 closed): met" in text
