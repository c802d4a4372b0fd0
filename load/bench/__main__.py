"""`python -m load.bench`: our stack vs SMG vs the bare engine, side by side, on simulated engines.

Starts the engine simulator in fast mode (no engine time), our stack (Envoy + `extproc serve`) and SMG
(from PyPI, in its own cached venv), then runs each workload against the floor and both gateways in
turns, and prints per workload: gateway CPU per request, added p50/p99 latency over the floor, maximum
requests/s, and the ratios ours/SMG; then a concurrency sweep of one workload (requests/s and latency
at 1, 2, 4, 8, 16 clients). The full results go to load/results/bench-<time>.json (and latest.json), the
plots (latency CDFs, throughput vs concurrency) beside it as PNG when matplotlib is installed. See
docs/benchmarks.md for how to read them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from extproc import envoy_module
from load.bench import gateways
from load.bench.floor import FloorTarget
from load.bench.plan import FULL, QUICK, Plan, scaled, with_rounds
from load.bench.procs import StartError
from load.bench.report import breakdown, compare, noise_note, stream_cost, sweep_table, table, tool_call_cost
from load.bench.run import BenchTarget, Sweep, run_plan, run_sweep
from load.loadgen.openai_target import OpenAITarget
from load.loadgen.records import json_safe
from load.loadgen.text import Vocab, load_vocab

TARGETS = ("floor", *gateways.OURS_TARGETS, gateways.RELAY, "smg")
DEFAULT_OUT = gateways.ROOT / "load" / "results"
DEFAULT_SWEEP = "1,2,4,8,16"
# Seconds per sweep level and target (times --scale): 5 levels x 3 targets of this fit the time budget.
SWEEP_LEVEL_S = {"full": 4.0, "quick": 1.5}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m load.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests: 1-2 minutes")
    names = ",".join(w.name for w in FULL.workloads)
    parser.add_argument("--workloads", default=None, help=f"comma list (default all): {names}")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every phase's request count (e.g. 2: less noise)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="repeat the plan (default: 3, quick: 1)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma list of " + ",".join(TARGETS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (load/results)")
    parser.add_argument("--smg-venv", type=Path, default=gateways.DEFAULT_SMG_VENV)
    parser.add_argument(
        "--envoy-concurrency",
        type=int,
        default=gateways.cpu_count(),
        help="Envoy worker threads (default: the CPUs, as `extproc up` and SMG's runtime use)",
    )
    parser.add_argument(
        "--sweep",
        default=DEFAULT_SWEEP,
        help=f"client counts of the concurrency sweep (default {DEFAULT_SWEEP}; 'off': no sweep)",
    )
    parser.add_argument("--sweep-workload", default="chat", help="the workload the sweep runs (default chat)")
    parser.add_argument(
        "--sweep-s",
        type=float,
        default=None,
        help="seconds per sweep level and target (default 4, quick 1.5, times --scale)",
    )
    parser.add_argument(
        "--stream-flush-ms",
        type=int,
        default=0,
        help="the module path's stream_flush_ms (default 0: every engine message's bytes go at once)",
    )
    parser.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    args = parser.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(args.targets) - set(TARGETS)
    if unknown or not args.targets:
        parser.error(f"--targets: unknown {', '.join(sorted(unknown)) or '(none given)'}")
    plan = QUICK if args.quick else FULL
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.scale != 1.0:
        plan = scaled(plan, args.scale)
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        plan = with_rounds(plan, args.rounds)
    args.sweep = _sweep(parser, args, plan)
    if args.workloads:
        names = {w.strip() for w in args.workloads.split(",") if w.strip()}
        unknown = names - {w.name for w in plan.workloads}
        if unknown:
            parser.error(f"--workloads: unknown {', '.join(sorted(unknown))}")
        plan = plan.only(names)
    args.plan = plan
    return args


def _sweep(parser: argparse.ArgumentParser, args: argparse.Namespace, plan: Plan) -> Sweep | None:
    if args.sweep.strip().lower() in ("", "off", "none", "0"):
        return None
    try:
        levels = tuple(sorted({int(v) for v in args.sweep.split(",") if v.strip()}))
    except ValueError:
        parser.error(f"--sweep: expected a comma list of client counts, got {args.sweep!r}")
    if not levels or levels[0] < 1:
        parser.error("--sweep: client counts must be at least 1")
    workload = next((w for w in plan.workloads if w.name == args.sweep_workload), None)
    if workload is None:
        parser.error(f"--sweep-workload: unknown {args.sweep_workload}")
    if args.sweep_s is not None and args.sweep_s <= 0:
        parser.error("--sweep-s must be positive")
    level_s = args.sweep_s or max(0.5, SWEEP_LEVEL_S["quick" if args.quick else "full"] * args.scale)
    # Time-boxed: the request count is a cap (a level ends at either), at least 8 requests per client.
    requests = max(workload.throughput_requests, 8 * levels[-1])
    if workload.timing:
        parser.error(f"--sweep-workload: {workload.name} runs on timed engines, which the sweep does not set")
    return Sweep(workload.name, levels, requests, level_s, warmup_requests=plan.warmup_requests)


def _run_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def environment(args: argparse.Namespace) -> dict[str, Any]:
    from extproc import __version__
    from extproc.envoy_bootstrap import envoy_binary

    commit = _run_text(["git", "-C", str(gateways.ROOT), "rev-parse", "--short", "HEAD"])
    dirty = bool(_run_text(["git", "-C", str(gateways.ROOT), "status", "--porcelain"]))
    return {
        "cpus": gateways.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "extproc": __version__,
        "commit": commit + ("+dirty" if dirty else ""),
        "envoy": _run_text([envoy_binary(), "--version"]).split("version:")[-1].strip()[:80],
        "envoy_concurrency": args.envoy_concurrency,
        "stream_flush_ms": getattr(args, "stream_flush_ms", 0),  # load.bench_routing has none
        "smg": gateways.SMG_VERSION if "smg" in args.targets else None,
    }


def targets_with_floor(targets: list[BenchTarget], floor: FloorTarget | None) -> list[BenchTarget]:
    return ([BenchTarget("floor", floor, {})] if floor else []) + targets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan: Plan = args.plan
    from extproc.models import default_model_dir, served_model_name

    model_dir = default_model_dir()
    model = served_model_name(model_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"bench-{stamp}-logs"
    begun = time.monotonic()

    smg_binary = None
    if "smg" in args.targets:
        try:
            smg_binary = gateways.ensure_smg(args.smg_venv, log_dir)
        except (OSError, subprocess.CalledProcessError, StartError) as exc:
            print(f"SMG unavailable, running without it: {exc}", file=sys.stderr)

    engines = gateways.start_engines(plan.engines, log_dir, plan.max_model_len)
    running: list[gateways.Gateway] = []
    try:
        for name, response_path in gateways.OURS_TARGETS.items():
            if name not in args.targets:
                continue
            if response_path == "module" and envoy_module.module_dir() is None:
                print(
                    f"{name} unavailable, running without it: build it with `make envoy-module`",
                    file=sys.stderr,
                )
                continue
            running.append(
                gateways.start_ours(
                    engines.addresses,
                    model,
                    log_dir,
                    envoy_concurrency=args.envoy_concurrency,
                    response_path=response_path,
                    model_dir=model_dir,
                    stream_flush_ms=args.stream_flush_ms,
                )
            )
        if gateways.RELAY in args.targets:
            running.append(
                gateways.start_relay(engines.addresses, log_dir, envoy_concurrency=args.envoy_concurrency)
            )
        if smg_binary is not None:
            running.append(gateways.start_smg(smg_binary, engines.addresses, model_dir, model, log_dir))
        vocab = load_vocab(model_dir / "tokenizer.json")
        results, swept = asyncio.run(_measure(args, plan, vocab, model, engines, running))
    finally:
        for gw in running:
            gw.stop()
        engines.child.stop()

    comparison = compare(results)
    report = {
        "started_at": stamp,
        "quick": args.quick,
        "wall_s": time.monotonic() - begun,
        "environment": {**environment(args), "engines_argv": engines.argv[1:]},
        "plan": asdict(plan),
        "comparison": comparison,
        "results": results,
    }
    if args.sweep is not None:
        report["sweep"] = {**asdict(args.sweep), "results": swept}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench-{stamp}.json"
    path.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    shutil.copyfile(path, args.out / "latest.json")
    print()
    print(table(comparison))
    if line := tool_call_cost(comparison):
        print(line)
    if streams := stream_cost(comparison):
        print()
        print(streams)
    print()
    print(breakdown(results))
    if swept:
        print()
        print(sweep_table(swept))
        print()
    rounds = f"medians over {plan.rounds} rounds; " if plan.rounds > 1 else ""
    print(f"{rounds}{noise_note(results)}")
    print(f"wall time {report['wall_s']:.0f} s; results in {path}")
    if not args.no_plots:
        _plot(report, args.out, f"bench-{stamp}")
    return 0


def _plot(report: dict[str, Any], out: Path, stem: str) -> None:
    from load.bench import plots

    if not plots.available():
        print(plots.MISSING_NOTE)
        return
    written = plots.write_plots(json_safe(report), out, stem)
    if written:
        print("plots: " + ", ".join(str(p) for p in written))


async def _measure(
    args: argparse.Namespace,
    plan: Plan,
    vocab: Vocab,
    model: str,
    engines: gateways.Engines,
    running: list[gateways.Gateway],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # The floor's gRPC channels start threads: only now, after every child process was forked.
    floor = FloorTarget(engines.addresses, vocab) if "floor" in args.targets else None
    http = [
        (gw, OpenAITarget(gw.base_url, model, ignore_eos=True)) for gw in running if gw.name != gateways.RELAY
    ]
    # The relay is called as the floor is (gRPC, token ids), through Envoy, over as many connections as
    # the most clients a phase runs (the HTTP gateways get a connection per client).
    connections = max(w.throughput_concurrency or plan.throughput_concurrency for w in plan.workloads)
    relays = [
        (gw, FloorTarget([gw.base_url] * connections, vocab)) for gw in running if gw.name == gateways.RELAY
    ]
    listed = [BenchTarget(gw.name, t, gw.processes) for gw, t in [*http, *relays]]
    targets = targets_with_floor(listed, floor)

    def check_alive() -> None:
        for gw in running:
            gw.check_alive()
        if not engines.child.alive():
            raise StartError(f"the engines died:\n{engines.child.log_tail()}")

    try:
        results = await run_plan(plan, vocab, targets, engines.pids, check_alive, engines.retime)
        swept = await run_sweep(args.sweep, vocab, targets, engines.pids, check_alive) if args.sweep else []
        return results, swept
    finally:
        for _, target in http:
            target.close()
        for _, relay in relays:
            await relay.close()
        if floor is not None:
            await floor.close()


if __name__ == "__main__":
    sys.exit(main())
