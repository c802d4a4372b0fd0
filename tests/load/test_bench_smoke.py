"""`python -m load.bench` end to end on a tiny plan: simulator, our stack and the floor as real processes
(SMG is left out: it is a PyPI install of its own, exercised by `make bench`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from load.bench.plan import FULL, QUICK, scaled

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_floor_and_ours_and_reports(quick_bench: tuple[Path, str]) -> None:
    out, stdout = quick_bench  # the run exited 0
    assert "gateway CPU ms/req" in stdout and "chat-stream" in stdout

    report = json.loads((out / "latest.json").read_text())
    results = {(r["target"], r["workload"], r["phase"]): r for r in report["results"]}
    assert len(results) == 2 * 2 * 2  # targets x workloads x phases
    for (target, workload, _), r in results.items():
        assert r["summary"]["errors"] == 0 and r["summary"]["ok"] > 0
        # Same prompts for every target: the floor's pre-tokenized prompt is as long as the gateway's.
        twin = results[("floor" if target == "ours" else "ours", workload, r["phase"])]
        assert r["summary"]["prompt_tokens_mean"] == twin["summary"]["prompt_tokens_mean"]
        gateway_cpu = r["cpu_ms_per_request"]["gateway"]
        if target == "floor":
            assert gateway_cpu == 0
        elif r["phase"] == "throughput":  # enough requests to be many clock ticks of CPU
            assert gateway_cpu > 0
    ours = report["comparison"]["chat"]["ours"]
    assert set(results[("ours", "chat", "throughput")]["gateway_cpu_ms_per_request"]) == {"extproc", "envoy"}
    assert ours["added_p50_ms"] == ours["p50_ms"] - report["comparison"]["chat"]["floor"]["p50_ms"]
    assert "ratio" not in report["comparison"]["chat"]  # no SMG, no ratio
    assert any(p.name.startswith("bench-") and p.suffix == ".json" for p in out.iterdir())


def test_quick_plan_is_a_smaller_full_plan() -> None:
    assert [w.name for w in QUICK.workloads] == [w.name for w in FULL.workloads]
    for quick, full in zip(QUICK.workloads, FULL.workloads, strict=True):
        assert quick.latency_requests < full.latency_requests
        assert quick.throughput_requests < full.throughput_requests
    tiny = scaled(FULL, 0.0001)
    assert all(w.latency_requests == 8 and w.throughput_requests == 16 for w in tiny.workloads)


def test_long_streams_run_on_timed_engines_through_both_response_paths(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "load.bench", "--quick", "--scale", "0.05", "--sweep", "off", "--no-plots"]
    argv += ["--targets", "floor,ours,ours-module", "--workloads", "stream-16x4", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "long streams (16 clients, 2 ms steps)" in proc.stdout and "ours-module extproc" in proc.stdout

    report = json.loads((tmp_path / "latest.json").read_text())
    results = {(r["target"], r["phase"]): r for r in report["results"]}
    assert set(results) == {
        (t, p) for t in ("floor", "ours", "ours-module") for p in ("latency", "throughput")
    }
    for (_, phase), r in results.items():
        assert r["summary"]["errors"] == 0 and r["summary"]["ok"] > 0
        assert r["summary"]["output_tokens_mean"] == 16
        assert r["concurrency"] == (1 if phase == "latency" else 16)
    # The engines took their 2 ms steps: 16 tokens are at least 8 steps apart from the first.
    assert report["comparison"]["stream-16x4"]["floor"]["p50_ms"] >= 16 * 2
    module = report["comparison"]["stream-16x4"]["ours-module"]
    assert set(module["cpu_ms_by_process"]) == {"extproc", "envoy"}
