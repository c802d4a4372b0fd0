"""The workload suite (issue 13): every shape of `shapes.py`, closed loop and open loop at several shares
of capacity, several seeds, engine counts and KV capacities; our policies, SMG cache_aware and round
robin on the same engines and the same arrivals, each run on freshly started engines.

Per (shape, seed, engine config):
1. Closed loop, `clients_per_engine` (3, or the shape's own draw) x engines clients, each running whole
   sessions (a session's turns back to back): SMG first, whose completions per second are the shape's
   capacity (round robin's when SMG is absent), then ours and round robin.
2. Open loop at each `--loads` share of that capacity: Poisson arrivals, each the next turn of one of
   the shape's sessions in progress (`shapes.interleave`), the same arrivals and prompts for every
   gateway.
`--repeats N` runs every point N times (same arrivals, fresh engines each time), the gateways in turn
within each repeat; the report quotes the median ratio over the repeats and the worst one.
`--confirm-over R` runs a point again, up to `--confirm-runs` runs, when one of ours measured a mean TTFT
over R x SMG's, or a p90 or hit rate past the issue's targets: one run of a closed-loop point can move by
a quarter with no change of policy. Reported over
the requests that started after the warm-up: hit rate, TTFT mean/p50/p90/p99, completions
per second, max/mean engine load (requests served, and mean requests in flight). The report
(`suite_report.py`, JSON + markdown) leads with the shape where our default policy's mean TTFT over
SMG's is worst.

Each run also reports where a session's follow-up turns found their history (`followups.py`), and
`--replicas` adds two-replica runs of ours and SMG on the same engines (`replicas.py`).

`python -m load.bench_routing.suite [--quick]` (`make bench-routing`); docs/routing-benchmark.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from load.bench import gateways as bench_gateways
from load.bench.procs import StartError
from load.bench_routing import followups, gateways, paired, placement, replicas, shapes, suite_report
from load.bench_routing.engines import EngineConfig, EngineWatch, start_engines
from load.bench_routing.run import (
    Context,
    RunSpec,
    _ms,
    _start_gateway,
    run_context,
    summarize,
    time_per_output_token,
)
from load.bench_routing.target import SplitTarget
from load.bench_routing.trace import RoutedSpec
from load.loadgen.records import Record, json_safe
from load.loadgen.runner import open_loop, poisson_arrivals
from load.loadgen.text import load_vocab

DEFAULT_OUT = bench_gateways.ROOT / "load" / "results"


@dataclass(frozen=True)
class Gateway:
    """One gateway under test: ours with a policy (and router settings), SMG, or round robin."""

    name: str
    spec: RunSpec
    routing_config: str | None = None
    # Replicas (`replicas.py`): "one", ours "extproc_x2" / "envoy_x2", SMG "smg_x2".
    topology: str = "one"
    # What a replica topology is compared with: the same gateway as one replica.
    baseline: str | None = None


SMG = Gateway("smg", RunSpec("smg", gateways.SMG_POLICY))
ROUND_ROBIN = Gateway("round_robin", RunSpec("ours", "round_robin"))
OURS_DEFAULT = "kv_events"


def ours(policy: str, routing_config: str | None = None, name: str | None = None) -> Gateway:
    return Gateway(name or policy, RunSpec("ours", policy), routing_config)


def replica_gateways(single: Sequence[Gateway], smg: bool) -> list[Gateway]:
    """`--replicas`: each of ours as two extproc replicas behind one Envoy and as two Envoy + extproc
    stacks, and SMG as two gateways; each compared with its one-replica run."""
    out = [replace(SMG, name="smg_x2", topology="smg_x2", baseline="smg")] if smg else []
    for gw in single:
        for topology in replicas.OURS_TOPOLOGIES[1:]:
            out.append(replace(gw, name=f"{gw.name}_{topology}", topology=topology, baseline=gw.name))
    return out


@dataclass(frozen=True)
class Mode:
    duration_s: float
    warmup_s: float
    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    engine_counts: tuple[int, ...]  # the sweep, beyond the main grid's EngineConfig.engines
    block_counts: tuple[int, ...]


FULL = Mode(40.0, 8.0, (0, 1, 2), (0.5, 0.7, 0.9, 1.1), (2, 8), (512, 2048))
QUICK = Mode(14.0, 4.0, (0,), (0.9,), (), ())


@dataclass(frozen=True)
class Cell:
    """One (shape, seed, engine config) of the suite: its closed-loop runs, then its open-loop ones."""

    shape: str
    seed: int
    config: EngineConfig
    sweep: str  # "main", "engines", "blocks"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.bench_routing.suite", description=__doc__)
    p.add_argument(
        "--quick", action="store_true", help="one seed, closed loop + 90%%, 14 s runs, no sweeps (~20 min)"
    )
    p.add_argument("--shapes", default=",".join(shapes.SHAPES), help="comma list of shapes")
    p.add_argument("--policies", default=OURS_DEFAULT, help="our policies, comma list (default kv_events)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=POLICY:JSON",
        help="an extra run of ours with router settings, e.g. 'booked=kv_events:{\"book_routed\":true}'",
    )
    p.add_argument("--seeds", default=None, help="comma list (default 0,1,2; quick 0)")
    p.add_argument("--loads", default=None, help="open-loop shares of capacity (default .5,.7,.9,1.1)")
    p.add_argument("--no-closed", action="store_true", help="skip the closed-loop runs (capacity: --rate)")
    p.add_argument("--rate", type=float, default=None, help="fixed capacity in requests/s (skips probing)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every point (same arrivals, fresh engines each); the report quotes their median",
    )
    p.add_argument(
        "--confirm-over",
        type=float,
        default=None,
        metavar="RATIO",
        help="a point where a run of ours measured a mean TTFT over RATIO x SMG's (or a p90 over 1.05x, or"
        " hits more than 0.5 points under SMG's) runs again until it has --confirm-runs runs (one run of a"
        " closed-loop point can move 28%%: docs/routing-benchmark.md)",
    )
    p.add_argument("--confirm-runs", type=int, default=3, help="runs of a point --confirm-over picks")
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--warmup", type=float, default=None)
    p.add_argument("--engines", type=int, default=EngineConfig.engines, help="engines in the main grid")
    p.add_argument("--num-blocks", type=int, default=EngineConfig.num_blocks, help="KV blocks per engine")
    p.add_argument("--sweep-engines", default=None, help="engine counts swept (default full: 2,8)")
    p.add_argument("--sweep-blocks", default=None, help="KV blocks per engine swept (default full: 512,2048)")
    p.add_argument("--sweep-shapes", default=None, help="shapes the sweeps run (default: all)")
    p.add_argument("--time-scale", type=float, default=EngineConfig.time_scale)
    p.add_argument("--no-smg", action="store_true")
    p.add_argument("--no-rr", action="store_true", help="leave round robin out")
    p.add_argument(
        "--replicas",
        action="store_true",
        help="add two-replica runs: ours as 2 extproc behind 1 Envoy and as 2 Envoys, SMG as 2 gateways",
    )
    p.add_argument("--smg-venv", type=Path, default=bench_gateways.DEFAULT_SMG_VENV)
    p.add_argument("--smg-args", default="")
    p.add_argument("--envoy-concurrency", type=int, default=bench_gateways.cpu_count())
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    mode = QUICK if args.quick else FULL
    args.shapes = _names(args.shapes, shapes.SHAPES, p, "--shapes")
    args.policies = _names(args.policies, gateways.POLICIES, p, "--policies")
    args.seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else mode.seeds
    args.loads = tuple(float(x) for x in args.loads.split(",")) if args.loads else mode.loads
    args.duration = args.duration or mode.duration_s
    args.warmup = mode.warmup_s if args.warmup is None else args.warmup
    args.sweep_engines = _ints(args.sweep_engines, mode.engine_counts)
    args.sweep_blocks = _ints(args.sweep_blocks, mode.block_counts)
    args.sweep_shapes = _names(args.sweep_shapes, shapes.SHAPES, p, "--sweep-shapes") or args.shapes
    if args.warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.confirm_over is not None and not args.confirm_over > 0:
        p.error("--confirm-over must be a positive ratio")
    if args.confirm_runs < 1:
        p.error("--confirm-runs must be at least 1")
    if args.no_closed and args.rate is None:
        p.error("--no-closed needs --rate (the capacity open-loop loads are shares of)")
    args.variants = [_variant(v, p) for v in args.variant]
    return args


def _names(raw: str | None, known: Sequence[str], p: argparse.ArgumentParser, flag: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    names = tuple(x.strip() for x in raw.split(",") if x.strip())
    unknown = set(names) - set(known)
    if unknown or not names:
        p.error(f"{flag}: unknown {', '.join(sorted(unknown)) or '(none given)'}; known: {', '.join(known)}")
    return names


def _ints(raw: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if raw is None:
        return default
    return tuple(int(x) for x in raw.split(",") if x.strip())


def _variant(raw: str, p: argparse.ArgumentParser) -> Gateway:
    name, _, rest = raw.partition("=")
    policy, _, config = rest.partition(":")
    if not name or policy not in gateways.POLICIES or not config:
        p.error(f"--variant {raw!r}: want NAME=POLICY:JSON")
    json.loads(config)
    return ours(policy, config, name)


def cells(args: argparse.Namespace) -> list[Cell]:
    """The main grid (every shape and seed), then the sweeps (first seed only)."""
    base = replace(
        EngineConfig(), engines=args.engines, num_blocks=args.num_blocks, time_scale=args.time_scale
    )
    out = [Cell(s, seed, base, "main") for s in args.shapes for seed in args.seeds]
    for s in args.sweep_shapes:
        out += [Cell(s, args.seeds[0], replace(base, engines=n), "engines") for n in args.sweep_engines]
        out += [Cell(s, args.seeds[0], replace(base, num_blocks=b), "blocks") for b in args.sweep_blocks]
    return out


@contextmanager
def _routing_config(config: str | None) -> Iterator[None]:
    """Ours reads its router settings from EXTPROC_ROUTING_CONFIG (its documented setting)."""
    old = os.environ.pop("EXTPROC_ROUTING_CONFIG", None)
    if config is not None:
        os.environ["EXTPROC_ROUTING_CONFIG"] = config
    try:
        yield
    finally:
        os.environ.pop("EXTPROC_ROUTING_CONFIG", None)
        if old is not None:
            os.environ["EXTPROC_ROUTING_CONFIG"] = old


def run_one(
    gw: Gateway,
    ctx: Context,
    cell: Cell,
    shape: shapes.Shape,
    *,
    arrivals: Sequence[float] | None,
    duration_s: float,
    warmup_s: float,
    label: str,
) -> dict[str, Any]:
    """One gateway on fresh engines: closed loop (`arrivals` None) or open loop; its summary."""
    log_dir = ctx.log_dir / f"{cell.shape}-s{cell.seed}-e{cell.config.engines}-b{cell.config.num_blocks}"
    log_dir = log_dir / f"{label}-{gw.name}"
    engines = start_engines(cell.config, log_dir, request_log=log_dir / "engine-requests.jsonl")
    try:
        with _routing_config(gw.routing_config):
            doors = _start(gw, replace(ctx, config=cell.config), engines.addresses, log_dir)
        try:
            turns, wall0, watch, wall_s = asyncio.run(
                _drive(
                    [d.base_url for d in doors],
                    ctx.model,
                    engines.metrics_ports,
                    shape,
                    cell,
                    arrivals,
                    duration_s,
                )
            )
        finally:
            for door in doors:
                door.stop()
    finally:
        engines.stop()
    records = [r for _, r in turns]
    arrivals = placement.read_log(log_dir / "engine-requests.jsonl")
    _write_records(log_dir / "records.jsonl", turns, arrivals, wall0)
    summary = summarize(records, warmup_s, duration_s)
    flight = watch["mean_in_flight"]
    mean_flight = sum(flight) / len(flight) if flight else 0.0
    return {
        "gateway": gw.name,
        "wall_s": wall_s,
        "requests": summary["requests"],
        "errors": summary["errors"],
        "error_samples": summary["error_samples"],
        "hit_rate": summary["hit_rate"],
        "ttft_ms": summary["ttft_ms"],
        # The warm-up, apart: fresh engines with empty caches meet the full arrival rate (a cold start).
        "warmup_ttft_ms": _ms([r.ttft for r in records if r.start < warmup_s and r.ttft is not None]),
        "requests_per_s": summary["requests_per_s"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "tpot_ms": summary["tpot_ms"],
        "itl_ms": summary["itl_ms"],
        "served": watch["served"],
        "served_max_over_mean": watch["served_max_over_mean"],
        "in_flight_max_over_mean": max(flight) / mean_flight if mean_flight else None,
        "mean_in_flight": flight,
        "peak_in_flight": watch["peak_in_flight"],
        "topology": gw.topology,
        "doors": len(doors),
        "followups": followups.analyse(turns, warmup_s, cell.config.block_size),
        # Where the requests went against where their prompts were cached (`placement.py`).
        "placement": placement.summarize(arrivals, wall0 + warmup_s) if arrivals else None,
        "records": str(log_dir / "records.jsonl"),
    }


def _start(gw: Gateway, ctx: Context, engines: list[str], log_dir: Path) -> list[bench_gateways.Gateway]:
    """The gateway's front doors: one, or two for split replica topologies."""
    if gw.topology == "one":
        return [_start_gateway(gw.spec, ctx, engines, log_dir).gateway]
    if gw.spec.gateway == "smg":
        if ctx.smg_binary is None:
            raise RuntimeError("SMG is not installed")
        return replicas.start_smg(
            gw.topology, ctx.smg_binary, engines, ctx.model_dir, ctx.model, log_dir, ctx.smg_extra
        )
    return replicas.start_ours(
        gw.topology, gw.spec.policy, engines, ctx.model, log_dir, ctx.envoy_concurrency
    )


def _write_records(
    path: Path,
    turns: Sequence[tuple[Any, Record]],
    arrivals: Sequence[placement.Arrival] = (),
    wall0: float = 0.0,
) -> None:
    """Every request of the run, one JSON line each in arrival order (times in seconds from the run's
    start), to look at how a run unfolded: when queues formed, which session lost its history, which
    engine served it and how much of its prompt the best-holding engine had (`placement.annotate`, where
    the engines logged their requests: `arrivals`, with `wall0` the wall time of the records' zero)."""
    rows = []
    for spec, r in sorted(turns, key=lambda pair: pair[1].start):
        rows.append(
            {
                "start": r.start,
                "ttft": r.ttft,
                "latency": r.latency,
                "error": r.error,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "output_tokens": r.output_tokens,
                "tpot": time_per_output_token(r),
                "session": getattr(spec, "user", ""),
                "messages": len(spec.messages),
            }
        )
    placement.annotate(rows, arrivals, wall0)
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(json_safe(row)) + "\n")


async def _drive(
    base_urls: list[str],
    model: str,
    ports: list[int],
    shape: shapes.Shape,
    cell: Cell,
    arrivals: Sequence[float] | None,
    duration_s: float,
) -> tuple[list[tuple[RoutedSpec, Record]], float, dict[str, Any], float]:
    """The run's (spec, record) pairs, the wall time of their zero, the engines' report and the run's
    length."""
    target = SplitTarget(base_urls, model)
    try:
        begun = time.monotonic()
        async with EngineWatch(ports) as watch:
            if arrivals is None:
                clients = shape.clients_per_engine * cell.config.engines
                await closed_sessions(target, shape, clients, duration_s)
            else:
                specs = shapes.interleave(shape, len(arrivals))
                prepared = [target.prepare(s) for s in specs]
                await open_loop(target, prepared, arrivals)
        wall0 = target.wall0 if target.wall0 is not None else time.time()
        return target.turns, wall0, watch.report(), time.monotonic() - begun  # type: ignore[return-value]
    finally:
        target.close()


async def closed_sessions(target: SplitTarget, shape: shapes.Shape, clients: int, duration_s: float) -> None:
    """`clients` clients, each taking the shape's next session and sending its turns back to back (a
    turn after the previous one's answer), until `duration_s`; what is in flight then completes. Client
    k sends through front door k (mod the doors); the records are in `target.turns`."""
    sessions = shape.sessions()
    start = time.perf_counter()
    deadline = start + duration_s

    async def client(k: int) -> None:
        while time.perf_counter() < deadline:
            for spec in next(sessions):
                if time.perf_counter() >= deadline:
                    return
                await target.send(target.prepare(spec, via=k), start)

    await asyncio.gather(*(client(k) for k in range(clients)))


def run_cell(
    cell: Cell,
    args: argparse.Namespace,
    ctx: Context,
    vocab: Any,
    ours_gateways: list[Gateway],
    replica_runs: Sequence[Gateway] = (),
) -> dict[str, Any]:
    """The cell's closed-loop runs, its capacity, then its open-loop runs."""
    shape = shapes.make_shape(cell.shape, vocab, cell.seed)
    smg = [SMG] if ctx.smg_binary is not None else []
    rr = [] if args.no_rr else [ROUND_ROBIN]
    order = smg + ours_gateways + list(replica_runs) + rr  # the capacity's source first
    out: dict[str, Any] = {
        "shape": cell.shape,
        "seed": cell.seed,
        "sweep": cell.sweep,
        "engines": cell.config.engines,
        "num_blocks": cell.config.num_blocks,
        "params": shape.params,
        "active_sessions": shape.active,
        "points": [],
    }
    capacity = args.rate
    if not args.no_closed:
        where = f" {cell.sweep}: closed loop"
        for repeat, runs in _point(order, ctx, cell, shape, None, args, where, "closed"):
            out["points"].append(
                {"mode": "closed", "load": None, "rate": None, "repeat": repeat, "runs": runs}
            )
            source = next((r for r in runs if r.get("requests_per_s")), None)
            if capacity is None and source is not None:
                capacity = source["requests_per_s"]
                out["capacity_from"] = source["gateway"]
    out["capacity"] = capacity
    if not capacity:
        return out
    for load in args.loads:
        rate = load * capacity
        arrivals = open_loop_arrivals(rate, args.duration, cell.seed)
        where = f": open loop {load:.0%}"
        for repeat, runs in _point(order, ctx, cell, shape, arrivals, args, where, f"open{int(load * 100)}"):
            out["points"].append({"mode": "open", "load": load, "rate": rate, "repeat": repeat, "runs": runs})
    return out


def _point(
    order: Sequence[Gateway],
    ctx: Context,
    cell: Cell,
    shape: shapes.Shape,
    arrivals: Sequence[float] | None,
    args: argparse.Namespace,
    where: str,
    label: str,
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A point's repeats, each as it ends (each gateway in turn within one): `--repeats` of them, then
    more up to `--confirm-runs` when one of ours missed a target (`runs_wanted`), saying which. The
    progress line names the repeat when there are several; its log folders take a suffix after the
    first, so single runs keep their folder names."""
    done: list[list[dict[str, Any]]] = []
    while len(done) < (wanted := runs_wanted(done, args.repeats, args.confirm_over, args.confirm_runs)):
        repeat = len(done)
        if repeat == args.repeats:
            why = "; ".join(m for runs in done for m in suite_report.target_misses(runs, args.confirm_over))
            print(f"  {cell.shape} seed {cell.seed}{where}: confirming ({why})", file=sys.stderr)
        nth = f" (run {repeat + 1} of {wanted})" if wanted > 1 else ""
        suffix = f"-r{repeat}" if repeat else ""
        runs = []
        for gw in order:
            print(f"  {cell.shape} seed {cell.seed}{where}{nth}, {gw.name}", file=sys.stderr)
            runs.append(_guarded(gw, ctx, cell, shape, arrivals, args, label + suffix))
        _add_twin_hits(runs, args.warmup)
        done.append(runs)
        yield repeat, runs


def runs_wanted(
    done: Sequence[Sequence[dict[str, Any]]], repeats: int, confirm_over: float | None, confirm_runs: int
) -> int:
    """How many runs a point gets, given the repeats `done` so far: `repeats`, or `confirm_runs` once
    `repeats` are done and one of ours missed a target in any of them (`suite_report.target_misses`: a
    mean TTFT over `confirm_over` x SMG's, the p90 or the hit rate past the issue's)."""
    if confirm_over is None or len(done) < repeats:
        return repeats
    missed = any(suite_report.target_misses(runs, confirm_over) for runs in done)
    return max(repeats, confirm_runs) if missed else repeats


def open_loop_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrivals at `rate` per second over `duration_s`, drawn from `seed`."""
    drawn = poisson_arrivals(rate, int(rate * duration_s * 1.5) + 10, seed)
    return [t for t in drawn if t < duration_s]


def _add_twin_hits(runs: Sequence[dict[str, Any]], warmup_s: float) -> None:
    """Each of our runs' hit rate against SMG's over the requests both served (`paired.twin_hits`):
    `twin_hits.pts`, the routing's own difference where a closed loop's windows hold other requests."""
    smg = next((r for r in runs if r["gateway"] == SMG.name and "records" in r), None)
    if smg is None:
        return
    theirs = paired.read_records(Path(smg["records"]))
    for run in runs:
        if run is not smg and "records" in run:
            run["twin_hits"] = paired.twin_hits(paired.read_records(Path(run["records"])), theirs, warmup_s)


def _guarded(
    gw: Gateway,
    ctx: Context,
    cell: Cell,
    shape: shapes.Shape,
    arrivals: Sequence[float] | None,
    args: argparse.Namespace,
    label: str,
) -> dict[str, Any]:
    """A run; one that fails to start twice is recorded as failed and the suite goes on (once is often a
    port another process took between our pick and its bind)."""
    for attempt in (1, 2):
        try:
            return run_one(
                gw,
                ctx,
                cell,
                shape,
                arrivals=arrivals,
                duration_s=args.duration,
                warmup_s=args.warmup,
                label=f"{label}-retry" if attempt == 2 else label,
            )
        except (StartError, OSError, RuntimeError) as exc:
            print(f"    {gw.name} failed (attempt {attempt}): {exc}", file=sys.stderr)
            failure = str(exc)[-500:]
    return {"gateway": gw.name, "failed": failure}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from extproc.models import default_model_dir

    model_dir = default_model_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"suite-{stamp}-logs"
    begun = time.monotonic()
    vocab = load_vocab(model_dir / "tokenizer.json")
    ctx = run_context(args, model_dir, log_dir, EngineConfig())
    ours_gateways = [ours(p) for p in args.policies] + args.variants
    replica_runs = replica_gateways(ours_gateways, ctx.smg_binary is not None) if args.replicas else []
    results = []
    for cell in cells(args):
        results.append(run_cell(cell, args, ctx, vocab, ours_gateways, replica_runs))
        _write(args, stamp, begun, ours_gateways, replica_runs, results, partial=True)
    path = _write(args, stamp, begun, ours_gateways, replica_runs, results, partial=False)
    print(suite_report.markdown(json.loads(path.read_text())))
    print(f"wall time {time.monotonic() - begun:.0f} s; results in {path} and {path.with_suffix('.md')}")
    return 0


def _write(
    args: argparse.Namespace,
    stamp: str,
    begun: float,
    ours_gateways: list[Gateway],
    replica_runs: list[Gateway],
    results: list[dict[str, Any]],
    *,
    partial: bool,
) -> Path:
    """The JSON (rewritten after every cell, so a long suite cut short keeps what it measured) and,
    at the end, the markdown report beside it."""
    doc = {
        "started_at": stamp,
        "quick": args.quick,
        "partial": partial,
        "wall_s": time.monotonic() - begun,
        "default_policy": OURS_DEFAULT,
        "ours": [
            {"name": g.name, "policy": g.spec.policy, "routing_config": g.routing_config}
            for g in ours_gateways
        ],
        "replicas": [{"name": g.name, "topology": g.topology, "baseline": g.baseline} for g in replica_runs],
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "loads": list(args.loads),
            "seeds": list(args.seeds),
            "repeats": args.repeats,
            "confirm_over": args.confirm_over,
            "confirm_runs": args.confirm_runs,
            "clients_per_engine": shapes.CLIENTS_PER_ENGINE,
            "engine": asdict(replace(EngineConfig(), time_scale=args.time_scale)),
            "argv": sys.argv[1:],
            "smg_args": args.smg_args,
        },
        "cells": results,
    }
    doc["summary"] = suite_report.analyse(doc)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"suite-{stamp}.json"
    path.write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    if not partial:
        path.with_suffix(".md").write_text(suite_report.markdown(json.loads(path.read_text())))
        shutil.copyfile(path, args.out / "suite-latest.json")
        shutil.copyfile(path.with_suffix(".md"), args.out / "suite-latest.md")
    return path


if __name__ == "__main__":
    sys.exit(main())
