"""Turn phase results into the comparison: per workload and target, and the ratios ours/SMG.

- cpu_ms: gateway CPU per request (all gateway processes, user + system), throughput phase.
- added_p50_ms / added_p99_ms: the target's end-to-end latency minus the floor's, latency phase (1 client).
- rps: completed requests per second in the throughput phase (the maximum sustained on this machine).
Ratios are ours/SMG: below 1 is better for CPU and added latency, above 1 is better for rps.
With several rounds, each number is its median over the rounds (ratios are of medians).
The concurrency sweep is printed as it was measured: requests/s and end-to-end p50/p99 per level and target.
"""

from __future__ import annotations

import math
from typing import Any

from load.loadgen.workloads import AGENT_ANSWER_TOKENS

GATEWAYS = ("ours", "smg")


def _phase(results: list[dict[str, Any]], target: str, workload: str, phase: str) -> dict[str, float] | None:
    """The numbers of one (target, workload, phase), each the median over rounds."""
    runs = [r for r in results if (r["target"], r["workload"], r["phase"]) == (target, workload, phase)]
    if not runs:
        return None
    values = {
        "p50_ms": [r["summary"]["latency_ms"]["p50"] for r in runs],
        "p99_ms": [r["summary"]["latency_ms"]["p99"] for r in runs],
        "rps": [r["summary"]["requests_per_s"] for r in runs],
        "cpu_ms": [r["cpu_ms_per_request"]["gateway"] for r in runs],
        "errors": [r["summary"]["errors"] for r in runs],
    }
    out = {key: _median(v) for key, v in values.items()}
    out["errors"] = sum(values["errors"])
    out["rounds"] = len(runs)
    return out


def _median(values: list[float]) -> float:
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
        if "ours" in row and "smg" in row:
            ours, smg = row["ours"], row["smg"]
            row["ratio"] = {
                key: _ratio(ours.get(key), smg.get(key))
                for key in ("cpu_ms", "added_p50_ms", "added_p99_ms", "p50_ms", "p99_ms", "rps")
            }
        out[workload] = row
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def table(comparison: dict[str, dict[str, Any]]) -> str:
    """The side-by-side numbers, then the ratios ours/SMG."""
    head = (
        f"{'workload':<12} | {'gateway CPU ms/req':^17} | {'p50 ms, 1 client':^23} | "
        f"{'p99 ms, 1 client':^23} | {'req/s, 8 clients':^20}"
    )
    cols = f"{'floor':>7} {'ours':>7} {'smg':>7}"
    sub = f"{'':<12} | {'ours':>8} {'smg':>8} | {cols} | {cols} | {'floor':>6} {'ours':>6} {'smg':>6}"
    lines = [head, sub, "-" * len(sub)]
    for workload, row in comparison.items():
        ours, smg, floor = row.get("ours", {}), row.get("smg", {}), row.get("floor", {})

        def three(key: str, rows: tuple[dict[str, Any], ...] = (floor, ours, smg), width: int = 7) -> str:
            return " ".join(f"{_fmt(r.get(key), 0 if key == 'rps' else 2):>{width}}" for r in rows)

        lines.append(
            f"{workload:<12} | {_fmt(ours.get('cpu_ms')):>8} {_fmt(smg.get('cpu_ms')):>8} | "
            f"{three('p50_ms')} | {three('p99_ms')} | {three('rps', width=6)}"
        )
    ratio_head = (
        f"{'ours/SMG':<12} | {'CPU/req':>8} | {'added p50':>9} | {'added p99':>9} | {'p50':>6} | "
        f"{'p99':>6} | {'req/s':>6}   (added: minus the floor; lower is better except req/s)"
    )
    lines += ["", ratio_head, "-" * len(ratio_head)]
    for workload, row in comparison.items():
        ratio = row.get("ratio")
        if not ratio:
            continue
        lines.append(
            f"{workload:<12} | {_fmt(ratio['cpu_ms']):>8} | {_fmt(ratio['added_p50_ms']):>9} | "
            f"{_fmt(ratio['added_p99_ms']):>9} | {_fmt(ratio['p50_ms']):>6} | {_fmt(ratio['p99_ms']):>6} | "
            f"{_fmt(ratio['rps']):>6}"
        )
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
