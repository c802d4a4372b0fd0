"""`python -m load.bench_routing.scale_out` end to end on tiny runs of our stack (real simulator and Envoy,
extproc discovering its engines on the stand-in Kubernetes API; SMG left out): one engine added to one
mid-run, and one of two engines restarted mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from load.bench_routing.scale_out import Plan

ROOT = Path(__file__).resolve().parents[2]


def run_scale_out(tmp_path: Path, shape: str, *args: str) -> tuple[str, dict[str, Any]]:
    """One tiny run of ours alone (no SMG) on `shape`, 100% of the given rate: its report and its one run."""
    argv = [
        sys.executable,
        "-m",
        "load.bench_routing.scale_out",
        "--no-smg",
        "--shapes",
        shape,
        "--loads",
        "1",
    ]
    argv += [*args, "--warmup", "1", "--add-at", "4", "--settle", "2", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = tmp_path.glob("scale-out-*.json")
    [point] = json.loads(path.read_text())["points"]
    [run] = point["runs"]
    return proc.stdout, run


def test_an_engine_added_mid_run_takes_requests_only_after_the_add(tmp_path: Path) -> None:
    report, run = run_scale_out(
        tmp_path, "no_sharing", "--rate", "4", "--start", "1", "--add", "1", "--duration", "9"
    )
    assert "| no_sharing | 0 | 100% | kv_events |" in report
    assert run["gateway"] == "kv_events" and run["errors"] == 0
    windows = run["windows"]
    assert all(windows[name]["requests"] > 0 for name in ("before", "joining", "after"))
    # The added engine was unknown before the add, and discovery brought it into use within seconds:
    # it served its first request after the add, and a share of the rest.
    [first] = run["first_busy_after_event_s"]
    assert first is not None and 0 <= first < 3
    assert run["served"][1] > 0 and 0 < run["event_share"] < 1
    # Every request of the trace (the warm-up's too) reached exactly one engine.
    assert sum(run["served"]) == run["requests"] >= sum(w["requests"] for w in windows.values())


def test_an_engine_restarted_mid_run_is_used_again_and_only_its_cut_calls_fail(tmp_path: Path) -> None:
    report, run = run_scale_out(
        tmp_path,
        "sessions",
        "--rate",
        "6",
        "--start",
        "2",
        "--event",
        "restart",
        "--down",
        "1",
        "--duration",
        "10",
    )
    assert "# Restart: 2 engines, engine 0 restarted at 4 s (down 1 s)" in report
    # The run waited out the downtime, and the engine took requests again soon after it was back.
    assert run["event_took_s"] >= 1.0
    [first] = run["first_busy_after_event_s"]
    assert first is not None and 0 <= first < 3
    # No request lost without an error, none served twice: what the restart cut failed, and requests sent
    # while the engine was down went to the other one (Envoy's retry past a refused connection).
    assert sum(run["served"]) + run["errors"] == run["requests"]
    assert run["errors"] < run["requests"] / 4


def test_requests_are_measured_in_the_window_they_arrived_in() -> None:
    plan = Plan(start=3, add=1, add_at_s=14.0, settle_s=8.0, warmup_s=6.0, duration_s=36.0)
    assert [plan.window(t) for t in (0.0, 5.9, 6.0, 13.9, 14.0, 21.9, 22.0, 35.9)] == [
        None,
        None,
        "before",
        "before",
        "joining",
        "joining",
        "after",
        "after",
    ]
