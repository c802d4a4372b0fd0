"""The routing benchmark's table, its ratios to SMG cache_aware, and the issue's targets.

Ratios are run / SMG: below 1 is better for TTFT, above 1 better for the hit rate and throughput.
"""

from __future__ import annotations

import math
from typing import Any

SMG_RUN = "smg cache_aware"
# Issue 6: kv_events mean TTFT at most 0.8x SMG's, p90 no worse, hit rate at least SMG's.
TARGET_MEAN_TTFT_RATIO = 0.8


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _fmt(value: Any, spec: str = ".0f") -> str:
    v = _num(value)
    return "-" if math.isnan(v) else format(v, spec)


def _ratio(a: Any, b: Any) -> float:
    a, b = _num(a), _num(b)
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def row(run: dict[str, Any]) -> dict[str, float]:
    s, e, idx = run["summary"], run["engines"], run["index"]
    bytes_per_block = (
        idx.get("smg_bytes_per_block") if run["gateway"] == "smg" else idx.get("ours_bytes_per_block")
    )
    return {
        "hit_rate": _num(s["hit_rate"]),
        "ttft_mean": _num(s["ttft_ms"]["mean"]),
        "ttft_p90": _num(s["ttft_ms"]["p90"]),
        "rps": _num(s["requests_per_s"]),
        "out_tps": _num(s["output_tokens_per_s"]),
        "served_max_mean": _num(e.get("served_max_over_mean")),
        "peak_in_flight": float(max(e.get("peak_in_flight") or [0])),
        "bytes_per_block": _num(bytes_per_block),
        "errors": float(s["errors"]),
    }


def table(runs: list[dict[str, Any]]) -> str:
    smg = next((row(r) for r in runs if r["run"] == SMG_RUN), None)
    head = (
        f"{'run':<18} {'hit %':>6} {'TTFT mean':>9} {'p90':>7} {'req/s':>6} {'out tok/s':>9} "
        f"{'served':>7} {'peak':>5} {'B/block':>7} {'err':>4}"
    )
    if smg:
        head += f" | {'mean/SMG':>8} {'p90/SMG':>7} {'hit/SMG':>7}"
    unit = f"{'':<18} {'':>6} {'ms':>9} {'ms':>7} {'':>6} {'':>9} {'max/mean':>7} {'in-fl':>5} {'index':>7}"
    lines = [head, unit, "-" * len(head)]
    for run in runs:
        r = row(run)
        line = (
            f"{run['run']:<18} {_fmt(100 * r['hit_rate'], '.1f'):>6} {_fmt(r['ttft_mean']):>9} "
            f"{_fmt(r['ttft_p90']):>7} {_fmt(r['rps'], '.2f'):>6} {_fmt(r['out_tps']):>9} "
            f"{_fmt(r['served_max_mean'], '.2f'):>7} {_fmt(r['peak_in_flight']):>5} "
            f"{_fmt(r['bytes_per_block']):>7} {_fmt(r['errors']):>4}"
        )
        if smg:
            line += (
                f" | {_fmt(_ratio(r['ttft_mean'], smg['ttft_mean']), '.2f'):>8} "
                f"{_fmt(_ratio(r['ttft_p90'], smg['ttft_p90']), '.2f'):>7} "
                f"{_fmt(_ratio(r['hit_rate'], smg['hit_rate']), '.2f'):>7}"
            )
        lines.append(line)
    return "\n".join(lines)


def by_kind_table(runs: list[dict[str, Any]]) -> str:
    kinds = sorted({k for run in runs for k in run["summary"].get("by_kind", {})})
    head = f"{'run':<18}" + "".join(f" {k + ' hit %':>13} {k + ' TTFT':>12} {'p90':>6}" for k in kinds)
    lines = [head + "   (ms)", "-" * len(head)]
    for run in runs:
        cells = []
        for kind in kinds:
            s = run["summary"]["by_kind"].get(kind)
            if s is None:
                cells.append(f" {'-':>13} {'-':>12} {'-':>6}")
                continue
            cells.append(
                f" {_fmt(100 * _num(s['hit_rate']), '.1f'):>13} {_fmt(s['ttft_ms']['mean']):>12} "
                f"{_fmt(s['ttft_ms']['p90']):>6}"
            )
        lines.append(f"{run['run']:<18}" + "".join(cells))
    return "\n".join(lines)


def floor_table(runs: list[dict[str, Any]]) -> str:
    """Mean TTFT split into the floor (one prefill step over the uncached tokens, no wait) and what sits
    above it (waiting and transport), with the spread of the latter."""
    smg = next((r for r in runs if r["run"] == SMG_RUN), None)
    smg_over = _num(smg["summary"]["floor"]["over_floor_ms"]["mean"]) if smg else math.nan
    head = (
        f"{'run':<18} {'TTFT mean':>9} {'= floor':>8} {'+ above':>8} {'above p10':>9} {'p50':>6} "
        f"{'p90':>6} {'above/SMG':>9}"
    )
    lines = [head + "   (ms)", "-" * len(head)]
    for run in runs:
        f = run["summary"].get("floor")
        if not f:
            continue
        over = f["over_floor_ms"]
        lines.append(
            f"{run['run']:<18} {_fmt(run['summary']['ttft_ms']['mean']):>9} {_fmt(f['floor_ms'], '.1f'):>8} "
            f"{_fmt(over['mean'], '.1f'):>8} {_fmt(over['p10'], '.1f'):>9} {_fmt(over['p50'], '.1f'):>6} "
            f"{_fmt(over['p90'], '.1f'):>6} {_fmt(_ratio(over['mean'], smg_over), '.2f'):>9}"
        )
    return "\n".join(lines)


def engines_table(runs: list[dict[str, Any]]) -> str:
    """Per engine: requests served, peak in flight, and cache turnover (blocks filled / capacity; above 1
    the engine evicted)."""
    head = (
        f"{'run':<18} {'served per engine':<22} {'peak in flight':<16} {'cache turnover':<22} {'preempt':>7}"
    )
    lines = [head, "-" * len(head)]
    for run in runs:
        e = run["engines"]
        served = "/".join(str(v) for v in e.get("served", []))
        peaks = "/".join(str(v) for v in e.get("peak_in_flight", []))
        turnover = "/".join(f"{v:.1f}" for v in e.get("cache_turnover", []))
        lines.append(
            f"{run['run']:<18} {served:<22} {peaks:<16} {turnover:<22} {sum(e.get('preemptions', [])):>7}"
        )
    return "\n".join(lines)


def targets(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The issue's three targets for kv_events against SMG cache_aware; None without both runs."""
    ours = next((r for r in runs if r["run"] == "kv_events"), None)
    smg = next((r for r in runs if r["run"] == SMG_RUN), None)
    if ours is None or smg is None:
        return None
    a, b = row(ours), row(smg)
    mean_ratio = _ratio(a["ttft_mean"], b["ttft_mean"])
    p90_ratio = _ratio(a["ttft_p90"], b["ttft_p90"])
    checks = {
        "mean_ttft": {"ratio": mean_ratio, "target": f"<= {TARGET_MEAN_TTFT_RATIO}"},
        "p90_ttft": {"ratio": p90_ratio, "target": "<= 1.0"},
        "hit_rate": {"ours": a["hit_rate"], "smg": b["hit_rate"], "target": ">= SMG"},
    }
    checks["mean_ttft"]["met"] = mean_ratio <= TARGET_MEAN_TTFT_RATIO
    checks["p90_ttft"]["met"] = p90_ratio <= 1.0
    checks["hit_rate"]["met"] = a["hit_rate"] >= b["hit_rate"]
    return checks


def targets_text(checks: dict[str, Any] | None) -> str:
    if checks is None:
        return "targets: need both the kv_events and the SMG cache_aware runs"
    mean, p90, hit = checks["mean_ttft"], checks["p90_ttft"], checks["hit_rate"]

    def verdict(check: dict[str, Any]) -> str:
        return "MET" if check["met"] else "NOT MET"

    return "\n".join(
        [
            f"target kv_events mean TTFT <= 0.8x SMG's: {_fmt(mean['ratio'], '.2f')}x  {verdict(mean)}",
            f"target kv_events p90 TTFT no worse than SMG's: {_fmt(p90['ratio'], '.2f')}x  {verdict(p90)}",
            f"target kv_events hit rate >= SMG's: {_fmt(100 * hit['ours'], '.1f')}% vs "
            f"{_fmt(100 * hit['smg'], '.1f')}%  {verdict(hit)}",
        ]
    )


def capacity_text(capacity: dict[str, Any], rate: float, load: float) -> str:
    """One line per closed-loop probe, then the rate the trace ran at and whose capacity set it."""
    lines = []
    for key, probe in capacity["probes"].items():
        lines.append(
            f"capacity {probe['run']} (closed loop, {capacity['concurrency']} clients): "
            f"{probe['requests_per_s']:.2f} req/s, TTFT mean {_fmt(probe['ttft_ms']['mean'])} ms; "
            f"CPU: ours {100 * probe['own_cpu_share']:.0f}%, machine {100 * probe['machine_cpu_share']:.0f}%"
            + ("  <- the trace's rate" if key == capacity["from"] else "")
        )
    ours, smg = capacity["probes"].get("kv_events"), capacity["probes"].get("smg")
    if ours and smg:
        lines.append(
            f"at saturation, kv_events / SMG cache_aware: "
            f"{_fmt(_ratio(ours['requests_per_s'], smg['requests_per_s']), '.2f')}x req/s, "
            f"{_fmt(_ratio(ours['ttft_ms']['mean'], smg['ttft_ms']['mean']), '.2f')}x TTFT mean"
        )
    lines.append(
        f"timing model with no cache hits: {capacity['zero_hit_requests_per_s']:.2f} req/s; "
        f"trace at {rate:.2f} req/s ({load:.0%} of {capacity['probes'][capacity['from']]['run']})"
    )
    return "\n".join(lines)
