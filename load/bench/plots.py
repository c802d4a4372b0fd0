"""PNG plots of a benchmark run, drawn from its results JSON: latency CDFs and throughput vs concurrency.

- `<stem>-latency-cdf.png`: end-to-end latency CDF, one panel per workload, one colour per target (floor,
  ours, SMG); solid lines are the 1-client latency phase, dashed the 8-client throughput phase.
- `<stem>-ttft-cdf.png`: the same for time to first token, streamed workloads only.
- `<stem>-throughput.png`: requests/s, latency p50/p99 and gateway CPU per request against the number of
  clients: the concurrency sweep when the run had one, else the two levels every workload ran at.

matplotlib is optional (the `bench` extra): it is imported only here, only when drawing, and drawn through
the Agg canvas, so no display is needed. `python -m load.bench.plots load/results/latest.json` redraws a
saved run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MISSING_NOTE = "no plots: matplotlib is not installed (pip install matplotlib); the JSON has the data"

# Label and colour per target; the same in every figure.
TARGET_STYLE = {
    "floor": ("floor (engine direct, no gateway)", "#2ca02c"),
    "ours": ("ours (Envoy + extproc)", "#1f77b4"),
    "ours-module": ("ours (response path in Envoy)", "#9467bd"),
    "smg": ("SMG", "#ff7f0e"),
}
# The main plan's phases, as drawn in the CDFs.
PHASE_DASHES = {"latency": "-", "throughput": "--"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plots(report: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Draw every figure the report has data for into out_dir; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = report.get("results", [])
    written = []
    for name, draw in (
        ("latency-cdf", lambda: _cdf_figure(report, results, "latency")),
        ("ttft-cdf", lambda: _cdf_figure(report, results, "ttft")),
        ("throughput", lambda: _throughput_figure(report)),
    ):
        figure = draw()
        if figure is None:
            continue
        path = out_dir / f"{stem}-{name}.png"
        figure.savefig(path)
        written.append(path)
    return written


# --- data ---------------------------------------------------------------------------------------------


def _median(values: Iterable[float | None]) -> float | None:
    ordered = sorted(v for v in values if v is not None and not math.isnan(v))
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _targets(rows: Sequence[dict[str, Any]]) -> list[str]:
    seen = list(dict.fromkeys(r["target"] for r in rows))
    return [t for t in TARGET_STYLE if t in seen] + [t for t in seen if t not in TARGET_STYLE]


def _cdf(runs: Sequence[dict[str, Any]], metric: str) -> tuple[list[float], list[float]] | None:
    """The quantile curve of `metric` over rounds: each quantile the median of the rounds' (as the table)."""
    curves = [r["cdf_ms"] for r in runs if r.get("cdf_ms") and r["cdf_ms"].get(metric)]
    if not curves:
        return None
    percentiles = curves[0]["percentiles"]
    xs = [_median(c[metric][i] for c in curves) for i in range(len(percentiles))]
    points = [(x, p / 100) for x, p in zip(xs, percentiles, strict=True) if x is not None and x > 0]
    return ([x for x, _ in points], [y for _, y in points]) if points else None


def _levels(rows: Sequence[dict[str, Any]]) -> dict[str, dict[int, dict[str, float | None]]]:
    """Per target and client count: requests/s, p50, p99 and gateway CPU ms/request (medians over rounds)."""
    grouped: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in rows:
        grouped.setdefault(r["target"], {}).setdefault(r["concurrency"], []).append(r)
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for target, by_level in grouped.items():
        for level, runs in sorted(by_level.items()):
            out.setdefault(target, {})[level] = {
                "rps": _median(r["summary"]["requests_per_s"] for r in runs),
                "p50": _median(r["summary"]["latency_ms"]["p50"] for r in runs),
                "p99": _median(r["summary"]["latency_ms"]["p99"] for r in runs),
                "cpu": _median(r["cpu_ms_per_request"]["gateway"] for r in runs),
            }
    return out


def _prompt_tokens(rows: Sequence[dict[str, Any]]) -> float | None:
    return _median(r["summary"].get("prompt_tokens_mean") for r in rows)


# --- drawing ------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _style(target: str, index: int) -> tuple[str, str]:
    return TARGET_STYLE.get(target, (target, f"C{index + 3}"))


def _ms_axis(axis: Any) -> None:
    """A log axis labelled in plain milliseconds (1, 2, 3, 5, 10, ...), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def _subtitle(report: dict[str, Any]) -> str:
    env = report.get("environment", {})
    rounds = report.get("plan", {}).get("rounds", 1)
    parts = [
        f"{env.get('cpus', '?')} CPUs",
        f"commit {env.get('commit') or '?'}",
        f"run {report.get('started_at', '?')}",
        f"median of {rounds} rounds" if rounds > 1 else "1 round",
        "simulated engines, zero engine time",
    ]
    return ", ".join(parts)


def _legend(figure: Any, targets: Sequence[str], extra: Sequence[tuple[str, str]]) -> None:
    """One legend for the figure: a colour per target, then line styles (dash, label)."""
    from matplotlib.lines import Line2D

    colours = [(Line2D([], [], color=_style(t, i)[1], lw=2), _style(t, i)[0]) for i, t in enumerate(targets)]
    dashes = [(Line2D([], [], color="black", lw=1.5, linestyle=dash), label) for dash, label in extra]
    if figure.get_figwidth() >= 12:  # all in one row
        entries, ncols = colours + dashes, len(colours) + len(dashes)
    else:
        # Targets on one row, line styles on the next; the legend fills column by column.
        ncols = max(len(colours), len(dashes))
        blank = (Line2D([], [], alpha=0), "")
        top = colours + [blank] * (ncols - len(colours))
        bottom = dashes + [blank] * (ncols - len(dashes))
        entries = [entry for pair in zip(top, bottom, strict=True) for entry in pair]
    handles, labels = zip(*entries, strict=True)
    figure.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False)


def _cdf_figure(report: dict[str, Any], results: Sequence[dict[str, Any]], metric: str) -> Any:
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    rows = {w: [r for r in results if r["workload"] == w] for w in workloads}
    # TTFT exists for streams only: panels for the workloads that have some.
    drawn = [w for w in workloads if any(_cdf([r], metric) for r in rows[w])]
    if not drawn:
        return None
    targets = _targets(results)
    cols = 2 if len(drawn) == 4 else min(3, len(drawn))
    grid = (math.ceil(len(drawn) / cols), cols)
    figure = _figure(max(8.0, 4.6 * cols), 3.4 * grid[0] + 1.2)
    what = "End-to-end latency" if metric == "latency" else "Time to first token (streamed requests)"
    figure.suptitle(f"{what}: CDF per workload, further left is faster\n{_subtitle(report)}", fontsize=10)
    levels: dict[str, int] = {}
    for n, workload in enumerate(drawn):
        axes = figure.add_subplot(*grid, n + 1)
        for i, target in enumerate(targets):
            for phase, dash in PHASE_DASHES.items():
                runs = [r for r in rows[workload] if r["target"] == target and r["phase"] == phase]
                curve = _cdf(runs, metric)
                if curve is None:
                    continue
                levels[phase] = runs[0]["concurrency"]
                axes.plot(*curve, color=_style(target, i)[1], linestyle=dash, lw=1.6)
        tokens = _prompt_tokens(rows[workload])
        axes.set_title(workload + (f" (~{tokens:,.0f} prompt tokens)" if tokens else ""), fontsize=10)
        axes.set_xscale("log")
        _ms_axis(axes.xaxis)
        axes.set_ylim(0, 1.0)
        axes.set_xlabel(("latency" if metric == "latency" else "TTFT") + " (ms, log scale)")
        axes.set_ylabel("fraction of requests ≤ x")
        axes.grid(True, which="both", alpha=0.3)
    dashes = [(PHASE_DASHES[p], f"{c} client{'s' if c > 1 else ''} ({p} phase)") for p, c in levels.items()]
    _legend(figure, targets, dashes)
    return figure


def _throughput_figure(report: dict[str, Any]) -> Any:
    sweep = report.get("sweep") or {}
    if sweep.get("results"):
        panels = {sweep["workload"]: sweep["results"]}
        source = f"concurrency sweep, {sweep.get('level_s', 0):g} s per level"
    else:
        # No sweep: each workload ran at two levels (latency phase: 1 client; throughput phase: 8).
        results = report.get("results", [])
        panels = {}
        for r in results:
            panels.setdefault(r["workload"], []).append(r)
        source = "latency and throughput phases (no sweep in this run)"
    if not panels:
        return None
    targets = _targets([r for rows in panels.values() for r in rows])
    figure = _figure(15, 3.6 * len(panels) + 1.0)
    figure.suptitle(
        f"Throughput and latency vs concurrency (closed loop; {source})\n{_subtitle(report)}", fontsize=10
    )
    for row, (workload, rows) in enumerate(panels.items()):
        by_target = _levels(rows)
        rps, latency, cpu = (figure.add_subplot(len(panels), 3, 3 * row + k) for k in (1, 2, 3))
        clients = sorted({level for levels in by_target.values() for level in levels})
        for i, target in enumerate(targets):
            points = by_target.get(target, {})
            xs = sorted(points)
            color = _style(target, i)[1]

            def series(key: str, xs: list[int] = xs, points: dict = points) -> tuple[list[int], list[float]]:
                kept = [(x, points[x][key]) for x in xs if points[x][key] is not None]
                return [x for x, _ in kept], [v for _, v in kept]

            rps.plot(*series("rps"), color=color, marker="o", lw=1.8)
            latency.plot(*series("p50"), color=color, marker="o", lw=1.8, linestyle="-")
            latency.plot(*series("p99"), color=color, marker="^", lw=1.2, linestyle="--")
            if target != "floor":  # the floor has no gateway
                cpu.plot(*series("cpu"), color=color, marker="o", lw=1.8)
        for axes, label in (
            (rps, "completed requests/s"),
            (latency, "end-to-end latency (ms, log scale)"),
            (cpu, "gateway CPU per request (ms)"),
        ):
            axes.set_xscale("log", base=2)
            axes.set_xticks(clients, [str(c) for c in clients])
            axes.minorticks_off()
            axes.set_xlabel("concurrent clients")
            axes.set_ylabel(label)
            axes.grid(True, alpha=0.3)
        rps.set_ylim(bottom=0)
        cpu.set_ylim(bottom=0)
        latency.set_yscale("log")
        _ms_axis(latency.yaxis)
        tokens = _prompt_tokens(rows)
        name = workload + (f" (~{tokens:,.0f} prompt tokens)" if tokens else "")
        rps.set_title(f"{name}: throughput", fontsize=10)
        latency.set_title(f"{name}: latency p50 and p99", fontsize=10)
        cpu.set_title(f"{name}: gateway CPU per request", fontsize=10)
    _legend(figure, targets, [("-", "p50 latency"), ("--", "p99 latency")])
    return figure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench.plots", description=__doc__)
    parser.add_argument("results", type=Path, help="a results JSON written by python -m load.bench")
    parser.add_argument("--out", type=Path, default=None, help="directory for the PNGs (default: the JSON's)")
    args = parser.parse_args(argv)
    if not available():
        print(MISSING_NOTE, file=sys.stderr)
        return 1
    report = json.loads(args.results.read_text())
    stem = args.results.stem
    written = write_plots(report, args.out or args.results.parent, stem)
    if not written:
        print(f"{args.results}: nothing to draw (no results with latency quantiles)", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
