"""Turn phase results into the comparison: per workload and target, and the ratios ours/SMG.

- cpu_ms: gateway CPU per request (all gateway processes, user + system), throughput phase.
- added_p50_ms / added_p99_ms: the target's end-to-end latency minus the floor's, latency phase (1 client).
- rps: completed requests per second in the throughput phase (the maximum sustained on this machine).
Ratios are ours/SMG for each of our response paths (`ratio`: ext_proc, `ratio_module`: the Envoy module):
below 1 is better for CPU and added latency, above 1 is better for rps.
With several rounds, each number is its median over the rounds (ratios are of medians).
The concurrency sweep is printed as it was measured: requests/s and end-to-end p50/p99 per level and target.
"""

from __future__ import annotations

import math
from typing import Any

from load.loadgen.workloads import AGENT_ANSWER_TOKENS

GATEWAYS = ("ours", "ours-module", "envoy-relay", "smg")
# Our targets and the key of their ratio to SMG in a comparison row.
RATIO_KEYS = {"ours": "ratio", "ours-module": "ratio_module"}
# Issue 17's targets, gateway CPU per request ours/SMG, per long-stream workload.
CPU_TARGETS = {"stream-256": 0.7, "stream-256x4": 0.7, "stream-16": 0.8, "stream-16x4": 0.8}


def _phase(results: list[dict[str, Any]], target: str, workload: str, phase: str) -> dict[str, Any] | None:
    """The numbers of one (target, workload, phase), each the median over rounds."""
    runs = [r for r in results if (r["target"], r["workload"], r["phase"]) == (target, workload, phase)]
    if not runs:
        return None
    values = {
        "p50_ms": [r["summary"]["latency_ms"]["p50"] for r in runs],
        "p99_ms": [r["summary"]["latency_ms"]["p99"] for r in runs],
        "rps": [r["summary"]["requests_per_s"] for r in runs],
        "cpu_ms": [r["cpu_ms_per_request"]["gateway"] for r in runs],
        "tokens": [r["summary"].get("output_tokens_mean") for r in runs],
        "errors": [r["summary"]["errors"] for r in runs],
    }
    out: dict[str, Any] = {key: _median(v) for key, v in values.items()}
    out["errors"] = sum(values["errors"])
    out["rounds"] = len(runs)
    processes = dict.fromkeys(p for r in runs for p in r.get("gateway_cpu_ms_per_request", {}))
    out["cpu_ms_by_process"] = {
        p: _median([r["gateway_cpu_ms_per_request"].get(p) for r in runs]) for p in processes
    }
    return out


def _median(values: list[float | None]) -> float:
    ordered = sorted(v for v in values if v is not None and not math.isnan(v))
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b <= 0:
        return None
    return a / b


def compare(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    out: dict[str, dict[str, Any]] = {}
    for workload in workloads:
        floor_lat = _phase(results, "floor", workload, "latency")
        floor_tput = _phase(results, "floor", workload, "throughput")
        row: dict[str, Any] = {}
        if floor_lat:
            row["floor"] = {"p50_ms": floor_lat["p50_ms"], "p99_ms": floor_lat["p99_ms"]}
            if floor_tput:
                row["floor"]["rps"] = floor_tput["rps"]
        for name in GATEWAYS:
            lat = _phase(results, name, workload, "latency")
            tput = _phase(results, name, workload, "throughput")
            if not lat or not tput:
                continue
            entry: dict[str, Any] = {
                "cpu_ms": tput["cpu_ms"],
                "cpu_ms_by_process": tput["cpu_ms_by_process"],
                "output_tokens": tput["tokens"],
                "cpu_ms_c1": lat["cpu_ms"],
                "p50_ms": lat["p50_ms"],
                "p99_ms": lat["p99_ms"],
                "rps": tput["rps"],
                "errors": lat["errors"] + tput["errors"],
                "rounds": tput["rounds"],
            }
            if floor_lat:
                entry["added_p50_ms"] = lat["p50_ms"] - floor_lat["p50_ms"]
                entry["added_p99_ms"] = lat["p99_ms"] - floor_lat["p99_ms"]
            row[name] = entry
        for name, key in RATIO_KEYS.items():
            if name in row and "smg" in row:
                ours, smg = row[name], row["smg"]
                row[key] = {
                    k: _ratio(ours.get(k), smg.get(k))
                    for k in ("cpu_ms", "added_p50_ms", "added_p99_ms", "p50_ms", "p99_ms", "rps")
                }
        out[workload] = row
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _present(comparison: dict[str, dict[str, Any]]) -> list[str]:
    """The gateways some workload has numbers for, in GATEWAYS order."""
    return [g for g in GATEWAYS if any(g in row for row in comparison.values())]


def table(comparison: dict[str, dict[str, Any]]) -> str:
    """The side-by-side numbers (requests/s at the throughput phase's clients), then the ratios to SMG."""
    gws = _present(comparison) or ["ours", "smg"]
    everyone = ["floor", *gws]
    short = {"ours-module": "module", "envoy-relay": "relay"}

    def names(targets: list[str], width: int) -> str:
        return " ".join(f"{short.get(t, t):>{width}}" for t in targets)

    cpu_w, lat_w = 9 * len(gws) - 1, 8 * len(everyone) - 1
    head = (
        f"{'workload':<12} | {'gateway CPU ms/req':^{cpu_w}} | {'p50 ms, 1 client':^{lat_w}} | "
        f"{'p99 ms, 1 client':^{lat_w}} | {'req/s at load':^{7 * len(everyone) - 1}}"
    )
    sub = f"{'':<12} | {names(gws, 8)} | {names(everyone, 7)} | {names(everyone, 7)} | {names(everyone, 6)}"
    lines = [head, sub, "-" * len(sub)]
    for workload, row in comparison.items():

        def cells(key: str, targets: list[str], width: int, row: dict[str, Any] = row) -> str:
            digits = 0 if key == "rps" else 2
            return " ".join(f"{_fmt(row.get(t, {}).get(key), digits):>{width}}" for t in targets)

        lines.append(
            f"{workload:<12} | {cells('cpu_ms', gws, 8)} | {cells('p50_ms', everyone, 7)} | "
            f"{cells('p99_ms', everyone, 7)} | {cells('rps', everyone, 6)}"
        )
    for name, key in RATIO_KEYS.items():
        if not any(key in row for row in comparison.values()):
            continue
        label = f"{name}/SMG"
        ratio_head = (
            f"{label:<12} | {'CPU/req':>8} | {'added p50':>9} | {'added p99':>9} | {'p50':>6} | "
            f"{'p99':>6} | {'req/s':>6}   (added: minus the floor; lower is better except req/s)"
        )
        lines += ["", ratio_head, "-" * len(ratio_head)]
        for workload, row in comparison.items():
            ratio = row.get(key)
            if not ratio:
                continue
            lines.append(
                f"{workload:<12} | {_fmt(ratio['cpu_ms']):>8} | {_fmt(ratio['added_p50_ms']):>9} | "
                f"{_fmt(ratio['added_p99_ms']):>9} | {_fmt(ratio['p50_ms']):>6} | "
                f"{_fmt(ratio['p99_ms']):>6} | {_fmt(ratio['rps']):>6}"
            )
    return "\n".join(lines)


def stream_cost(comparison: dict[str, dict[str, Any]]) -> str:
    """The long-stream workloads' gateway CPU per request split by process, per token, and ours/SMG
    against issue 17's targets; empty when the run had none of them."""
    rows = {w: row for w, row in comparison.items() if w in CPU_TARGETS}
    if not rows:
        return ""
    lines = [
        "long streams (16 clients, 2 ms steps): gateway CPU ms/request (Envoy + extproc = total), "
        "us/token, ours/SMG vs target"
    ]
    for workload, row in rows.items():
        parts = []
        for name in GATEWAYS:
            entry = row.get(name)
            if not entry:
                continue
            split = " + ".join(f"{p} {_fmt(ms)}" for p, ms in entry["cpu_ms_by_process"].items())
            tokens = entry.get("output_tokens")
            per_token = _fmt(1000 * entry["cpu_ms"] / tokens, 0) if tokens else "-"
            total = f"{split} = {_fmt(entry['cpu_ms'])}" if name != "smg" else _fmt(entry["cpu_ms"])
            parts.append(f"{name} {total} ({per_token} us/token)")
        verdicts = []
        for name, key in RATIO_KEYS.items():
            ratio = (row.get(key) or {}).get("cpu_ms")
            if ratio is not None:
                met = "met" if ratio <= CPU_TARGETS[workload] else "missed"
                verdicts.append(f"{name}/SMG {_fmt(ratio)} ({met}, target <= {CPU_TARGETS[workload]})")
        relay, smg = row.get("envoy-relay"), row.get("smg")
        if relay and smg and smg["cpu_ms"]:
            floor = _fmt(relay["cpu_ms"] / smg["cpu_ms"])
            verdicts.append(f"envoy-relay/SMG {floor} (Envoy alone: the floor of a path in Envoy)")
        lines.append(f"  {workload}: " + "; ".join(parts))
        if verdicts:
            lines.append(f"  {'':<{len(workload)}}  " + "; ".join(verdicts))
    return "\n".join(lines)


def tool_call_cost(comparison: dict[str, dict[str, Any]]) -> str:
    """Gateway CPU per request of the streamed tool call over the same-length plain stream, per gateway (the
    issue's target for ours: at most 1.10), and the difference per streamed token: the tool call's parser
    and delta events, plus the tool request's own parse, validation and longer prompt (an upper bound on the
    parser's CPU per token); empty when the run had not both workloads."""
    tools, plain = comparison.get("tool-stream"), comparison.get("plain-stream")
    if not tools or not plain:
        return ""
    parts, per_token = [], []
    for name in GATEWAYS:
        tool_ms, plain_ms = tools.get(name, {}).get("cpu_ms"), plain.get(name, {}).get("cpu_ms")
        ratio = _ratio(tool_ms, plain_ms)
        if ratio is not None:
            parts.append(f"{name} {_fmt(ratio)}")
            per_token.append(f"{name} {_fmt(1000 * (tool_ms - plain_ms) / AGENT_ANSWER_TOKENS)}")
    return (
        "tool-call stream CPU/req over plain stream (tool-stream/plain-stream): "
        + ", ".join(parts)
        + f"\ntool-call stream's extra gateway CPU per streamed token, µs ({AGENT_ANSWER_TOKENS} tokens; "
        + "parser, call deltas and the tool request's parsing: an upper bound on the parser's): "
        + ", ".join(per_token)
    )


def noise_note(results: list[dict[str, Any]]) -> str:
    shares = sorted(r["foreign_cpu_share"] for r in results)
    if not shares:
        return ""
    worst = max(results, key=lambda r: r["foreign_cpu_share"])
    return (
        f"CPU used by other processes during phases: median {100 * shares[len(shares) // 2]:.0f}%, "
        f"max {100 * worst['foreign_cpu_share']:.0f}% of the machine "
        f"({worst['workload']} on {worst['target']}, {worst['phase']})"
    )


def breakdown(results: list[dict[str, Any]]) -> str:
    """Gateway CPU per request by process (throughput phase, median over rounds): where the time goes."""
    lines = []
    for target in GATEWAYS:
        runs = [r for r in results if r["target"] == target and r["phase"] == "throughput"]
        by_workload: dict[str, dict[str, list[float]]] = {}
        for r in runs:
            for process, ms in r["gateway_cpu_ms_per_request"].items():
                by_workload.setdefault(r["workload"], {}).setdefault(process, []).append(ms)
        if by_workload:
            parts = [
                f"{workload} " + " + ".join(f"{p} {_fmt(_median(v))}" for p, v in processes.items())
                for workload, processes in by_workload.items()
            ]
            lines.append(f"{target} CPU ms/req by process: " + "; ".join(parts))
    return "\n".join(lines)


def sweep_table(sweep: list[dict[str, Any]]) -> str:
    """Requests/s and end-to-end p50/p99 latency per client count (rows) and target (columns)."""
    if not sweep:
        return ""
    targets = list(dict.fromkeys(r["target"] for r in sweep))
    cell = {(r["target"], r["concurrency"]): r["summary"] for r in sweep}
    levels = sorted({r["concurrency"] for r in sweep})
    width = 22
    head = f"{'clients':>7} | " + " | ".join(f"{t:^{width}}" for t in targets)
    sub = f"{'':>7} | " + " | ".join(f"{'req/s':>6} {'p50 ms':>7} {'p99 ms':>7}" for _ in targets)
    lines = [f"concurrency sweep, {sweep[0]['workload']} (closed loop, end-to-end latency)", head, sub]
    lines.append("-" * len(sub))
    for level in levels:
        cells = []
        for target in targets:
            summary = cell.get((target, level))
            if summary is None:
                cells.append(f"{'-':>6} {'-':>7} {'-':>7}")
                continue
            latency = summary["latency_ms"]
            cells.append(
                f"{_fmt(summary['requests_per_s'], 0):>6} {_fmt(latency['p50']):>7} {_fmt(latency['p99']):>7}"
            )
        lines.append(f"{level:>7} | " + " | ".join(cells))
    return "\n".join(lines)
