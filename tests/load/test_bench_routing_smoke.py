"""`python -m load.bench_routing` end to end on a tiny trace (kv_events and round_robin on our stack, real
simulator, Envoy and index probe processes; SMG is left out), and the trace's sharing structure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extproc.models import default_model_dir
from load.bench_routing import report, trace
from load.loadgen.text import load_vocab

ROOT = Path(__file__).resolve().parents[2]


def test_routing_bench_runs_policies_on_one_trace_and_reports(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "load.bench_routing", "--no-smg", "--policies", "kv_events,round_robin"]
    argv += ["--duration", "7", "--warmup", "1", "--rate", "5", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT mean" in proc.stdout and "served per engine" in proc.stdout and "= floor" in proc.stdout
    assert "need both the kv_events and the SMG cache_aware runs" in proc.stdout

    result = json.loads((tmp_path / "routing-latest.json").read_text())
    assert result["capacity"] is None and result["trace"]["rate"] == 5
    runs = {r["run"]: r for r in result["runs"]}
    assert list(runs) == ["kv_events", "round_robin"]
    sent = result["trace"]["requests"]
    for run in runs.values():
        s = run["summary"]
        assert s["errors"] == 0 and s["ok"] == s["requests"] > 0
        # Every request of the trace reached exactly one engine.
        assert sum(run["engines"]["served"]) == sent
        assert run["engines"]["samples"] > 0 and max(run["engines"]["peak_in_flight"]) >= 1
        assert 40 < run["index"]["ours_bytes_per_block"] < 1000
        # Every request is listed in arrival order; the TTFT splits into a floor (one prefill step over
        # the uncached tokens, >= the engines' 10 ms step) and a non-negative wait above it.
        assert [r[0] for r in run["requests"]] == sorted(r[0] for r in run["requests"])
        assert len(run["requests"]) == sent and all(r[4] is not None for r in run["requests"])
        floor = s["floor"]
        assert floor["floor_ms"] >= 10 and floor["over_floor_ms"]["p50"] > 0
        assert floor["floor_ms"] + floor["over_floor_ms"]["mean"] == pytest.approx(s["ttft_ms"]["mean"])
    # Same trace for both: the same prompts after the warm-up.
    assert runs["kv_events"]["summary"]["prompt_tokens"] == runs["round_robin"]["summary"]["prompt_tokens"]
    # The engines' cache hits come back through the gateway, and following them beats spreading requests.
    assert runs["kv_events"]["summary"]["hit_rate"] > runs["round_robin"]["summary"]["hit_rate"] > 0
    assert runs["round_robin"]["engines"]["served_max_over_mean"] < 1.2


def test_trace_is_deterministic_and_shares_prefixes() -> None:
    vocab = load_vocab(default_model_dir() / "tokenizer.json")
    one = trace.build_trace(vocab, rate=8, duration_s=20, seed=3)
    assert one == trace.build_trace(vocab, rate=8, duration_s=20, seed=3)
    assert one.specs != trace.build_trace(vocab, rate=8, duration_s=20, seed=4).specs
    assert all(a < b for a, b in zip(one.arrivals, one.arrivals[1:], strict=False))
    assert {s.kind for s in one.specs} == {"chat", "system", "rag"}

    # A conversation's next turn re-sends everything its last turn sent, then adds to it.
    last: dict[str, tuple[object, ...]] = {}
    for spec in one.specs:
        assert spec.user and spec.stream
        if spec.kind == "chat":
            before = last.get(spec.user)
            if before is not None:
                assert spec.messages[: len(before)] == before and len(spec.messages) == len(before) + 2
            last[spec.user] = spec.messages
    assert any(len(m) > 3 for m in last.values())

    # System prompts and documents are shared; what follows them is each request's own.
    for kind, pool in (("system", trace.SYSTEM_PROMPTS), ("rag", trace.DOCUMENTS)):
        specs = [s for s in one.specs if s.kind == kind]
        assert len({s.messages[0] for s in specs}) <= len(pool) < len(specs)
        assert len({s.messages[-1] for s in specs}) == len(specs)
        assert all(s.prompt_tokens > min(n for n, _ in pool) for s in specs)


def test_targets_compare_kv_events_with_smg() -> None:
    def run(name: str, mean: float, p90: float, hit: float) -> dict[str, object]:
        summary = {"hit_rate": hit, "ttft_ms": {"mean": mean, "p90": p90}, "requests_per_s": 1.0}
        summary.update(output_tokens_per_s=1.0, errors=0)
        return {"run": name, "gateway": "x", "summary": summary, "engines": {}, "index": {}}

    met = report.targets([run("kv_events", 70, 100, 0.9), run(report.SMG_RUN, 100, 100, 0.9)])
    assert met is not None and all(c["met"] for c in met.values())
    missed = report.targets([run("kv_events", 85, 101, 0.8), run(report.SMG_RUN, 100, 100, 0.9)])
    assert missed is not None and not any(c["met"] for c in missed.values())
    assert report.targets([run("kv_events", 1, 1, 1)]) is None
