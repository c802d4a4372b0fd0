"""Engines joining mid-run, or restarting (issue 13): the cases `fresh_cache_weight` is for, measured for
both gateways.

Each run starts `--start + --add` simulated engines. The gateway is told of the first `--start` and, at
`--add-at` seconds into the trace, of the rest:
- ours through its Kubernetes discovery, as in a cluster: `k8s://` engines watched on a stand-in API
  server (`tests/discovery/fake_kube_api.py`: no Kubernetes runs here), one EndpointSlice per engine
  (each listens on its own port), the added engines' slices created at the add;
- SMG through its worker API (`POST /workers`), with its own warm-up of new workers at its defaults
  (`--worker-warmup-secs` 60, `--worker-warmup-share` 0.25, one hit in 8 diverted to a thin worker).

With `--event restart` no engine is added: at `--add-at` engine 0 restarts (`POST /restart` on the
simulator: every call on it is cut, its port refuses connections for `--down` seconds, and it comes back
with an empty cache, numbering its KV-event batches from 0). Both gateways know of all engines all along
and must notice the restart by themselves: the cut calls, the refused connections, the event streams.

The trace is open loop at each `--loads` share of the starting engines' capacity (SMG's closed-loop
completions per second on them, or `--rate`): at 1.1 a queue builds before the add that the added
engines must drain. Every gateway meets the same arrivals and prompts on fresh engines.

Reported per gateway over three windows of arrivals: before the add (after the warm-up), the `--settle`
seconds after it, and the rest. In each: requests, hit rate, TTFT mean and p90, each over SMG's. Beside
them: the added (or restarted) engines' share of the requests served, and how long after the add (or
after the restarted engine was back) each served its first; and the requests that failed.

`python -m load.bench_routing.scale_out [--quick]`; docs/routing-benchmark.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from load.bench import gateways as bench_gateways
from load.bench.procs import StartError
from load.bench_routing import followups, gateways, shapes, suite
from load.bench_routing.engines import EngineConfig, EngineWatch, start_engines
from load.bench_routing.run import Context, run_context, summarize
from load.bench_routing.target import SplitTarget
from load.bench_routing.trace import RoutedSpec
from load.loadgen.records import Record, json_safe
from load.loadgen.runner import open_loop
from load.loadgen.text import load_vocab
from tests.discovery.fake_kube_api import READY, FakeKubeApi, endpoint_slice

NAMESPACE, SERVICE = "inference", "engines"
WINDOWS = ("before", "joining", "after")
EVENTS = ("add", "restart")


@dataclass(frozen=True)
class Plan:
    """When engines join: `start` known from the beginning, `add` more at `add_at_s`; or, with the event
    `restart`, engine 0 of `start` restarts then, down `down_s` seconds."""

    start: int
    add: int
    add_at_s: float
    settle_s: float
    warmup_s: float
    duration_s: float
    event: str = "add"
    down_s: float = 0.0

    @property
    def event_engines(self) -> range:
        """The engines the event is about: those added, or the one restarted."""
        return range(self.start, self.start + self.add) if self.event == "add" else range(1)

    def window(self, start_s: float) -> str | None:
        """The window a request that arrived at `start_s` is measured in (None: the warm-up)."""
        if start_s < self.warmup_s:
            return None
        if start_s < self.add_at_s:
            return "before"
        return "joining" if start_s < self.add_at_s + self.settle_s else "after"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.bench_routing.scale_out", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one load (1.1), three shapes (~8 min)")
    p.add_argument("--shapes", default=None, help="comma list (default: all; quick: system_prompts,rag,zipf)")
    p.add_argument("--seeds", default="0", help="comma list")
    p.add_argument("--loads", default=None, help="shares of the starting engines' capacity (default .8,1.1)")
    p.add_argument("--rate", type=float, default=None, help="that capacity in requests/s (skips probing)")
    p.add_argument("--start", type=int, default=3, help="engines the gateways know from the start")
    p.add_argument("--add", type=int, default=None, help="engines added at --add-at (default 1; restart: 0)")
    p.add_argument("--event", choices=EVENTS, default="add", help="what happens at --add-at")
    p.add_argument("--down", type=float, default=2.0, help="restart: seconds the engine is down")
    p.add_argument("--num-blocks", type=int, default=EngineConfig.num_blocks)
    p.add_argument("--duration", type=float, default=36.0)
    p.add_argument("--warmup", type=float, default=6.0)
    p.add_argument("--add-at", type=float, default=14.0, help="seconds into the trace")
    p.add_argument("--settle", type=float, default=8.0, help="seconds after the add measured apart")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=POLICY:JSON",
        help="an extra run of ours with router settings, e.g. 'off=kv_events:{\"fresh_cache_weight\":null}'",
    )
    p.add_argument("--no-smg", action="store_true", help="ours alone (capacity: --rate, or round robin's)")
    p.add_argument("--smg-venv", type=Path, default=bench_gateways.DEFAULT_SMG_VENV)
    p.add_argument("--smg-args", default="")
    p.add_argument("--envoy-concurrency", type=int, default=bench_gateways.cpu_count())
    p.add_argument("--out", type=Path, default=suite.DEFAULT_OUT)
    args = p.parse_args(argv)
    default_shapes = "system_prompts,rag,zipf" if args.quick else ",".join(shapes.SHAPES)
    args.shapes = suite._names(args.shapes or default_shapes, shapes.SHAPES, p, "--shapes")
    args.seeds = tuple(int(s) for s in args.seeds.split(","))
    args.loads = tuple(float(x) for x in (args.loads or ("1.1" if args.quick else "0.8,1.1")).split(","))
    if not args.warmup < args.add_at < args.duration:
        p.error("want --warmup < --add-at < --duration")
    if args.add is None:
        args.add = 1 if args.event == "add" else 0
    if args.start < 1 or (args.event == "add" and args.add < 1):
        p.error("--start and --add must be at least 1")
    if args.event == "restart" and (args.add or args.down < 0):
        p.error("a restart adds no engine (--add 0) and needs --down >= 0")
    args.variants = [suite._variant(v, p) for v in args.variant]
    args.plan = Plan(
        args.start, args.add, args.add_at, args.settle, args.warmup, args.duration, args.event, args.down
    )
    return args


# --- how each gateway learns of the engines ---------------------------------------------------------------


def _slice(index: int, address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    return endpoint_slice(f"{SERVICE}-{index}", SERVICE, [(host, READY)], [("grpc", int(port))])


def _add_smg_worker(base_url: str, address: str) -> None:
    """SMG's worker API: the worker is registered in the background (~0.1 s here)."""
    body = json.dumps({"url": f"grpc://{address}"}).encode()
    request = urllib.request.Request(
        f"{base_url}/workers", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.status not in (200, 201, 202):
            raise RuntimeError(f"SMG refused worker {address}: {response.status}")


def _restart_engine(port: int, down_s: float) -> None:
    """The simulator's restart control; it answers once the engine is back."""
    body = json.dumps({"down_s": down_s}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/restart", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=down_s + 30) as response:
        if response.status != 200:
            raise RuntimeError(f"the engine on control port {port} did not restart: {response.status}")


def _start_gateway(
    gw: suite.Gateway, ctx: Context, addresses: list[str], start: int, log_dir: Path
) -> tuple[bench_gateways.Gateway, Callable[[], None], FakeKubeApi | None]:
    """The gateway on the first `start` engines, and the call that tells it of the rest."""
    if gw.spec.gateway == "smg":
        if ctx.smg_binary is None:
            raise RuntimeError("SMG is not installed")
        started = gateways.start_smg(
            ctx.smg_binary, addresses[:start], ctx.model_dir, ctx.model, log_dir, ctx.smg_extra
        )

        def add_workers() -> None:
            for address in addresses[start:]:
                _add_smg_worker(started.gateway.base_url, address)

        return started.gateway, add_workers, None
    kube = FakeKubeApi().start()
    try:
        for i, address in enumerate(addresses[:start]):
            kube.put(_slice(i, address))
        with suite._routing_config(gw.routing_config):
            gateway = bench_gateways.start_ours(
                [f"k8s://{NAMESPACE}/{SERVICE}"],
                ctx.model,
                log_dir,
                envoy_concurrency=ctx.envoy_concurrency,
                routing_policy=gw.spec.policy,
                extra_env={"EXTPROC_KUBERNETES_API": kube.url},
            )
    except BaseException:
        kube.stop()
        raise

    def add() -> None:
        for i, address in enumerate(addresses[start:], start):
            kube.put(_slice(i, address))

    return gateway, add, kube


# --- one run -----------------------------------------------------------------------------------------------


def run_one(
    gw: suite.Gateway,
    ctx: Context,
    shape: shapes.Shape,
    plan: Plan,
    arrivals: Sequence[float],
    log_dir: Path,
) -> dict[str, Any]:
    config = replace(ctx.config, engines=plan.start + plan.add)
    engines = start_engines(config, log_dir)
    try:
        gateway, add, kube = _start_gateway(gw, ctx, engines.addresses, plan.start, log_dir)
        restart = functools.partial(_restart_engine, engines.metrics_ports[0], plan.down_s)
        event = restart if plan.event == "restart" else add
        try:
            turns, watch = asyncio.run(
                _drive(gateway.base_url, ctx.model, engines.metrics_ports, shape, arrivals, plan, event)
            )
        finally:
            gateway.stop()
            if kube is not None:
                kube.stop()
    finally:
        engines.stop()
    suite._write_records(log_dir / "records.jsonl", turns)
    records = [r for _, r in turns]
    follow = followups.analyse(turns, plan.warmup_s, config.block_size)
    return {"gateway": gw.name, **_summary(records, watch, plan), "followups": follow}


async def _drive(
    base_url: str,
    model: str,
    ports: list[int],
    shape: shapes.Shape,
    arrivals: Sequence[float],
    plan: Plan,
    event: Callable[[], None],
) -> tuple[list[tuple[RoutedSpec, Record]], dict[str, Any]]:
    """The trace open loop with the event (the add, or the restart) at `plan.add_at_s`; each request's
    spec and record, and the engines' report with when each engine of the event first got busy after
    it was done (added, or back from its restart)."""
    target = SplitTarget([base_url], model)
    try:
        prepared = [target.prepare(s) for s in shapes.interleave(shape, len(arrivals))]
        async with EngineWatch(ports) as watch:
            begun = time.monotonic()

            async def event_later() -> tuple[float, float]:
                await asyncio.sleep(plan.add_at_s)
                at = time.monotonic()
                await asyncio.to_thread(event)
                done = time.monotonic()
                watch.rewatch(plan.event_engines)  # a restarted engine was busy before
                return at, done

            later = asyncio.create_task(event_later())
            await open_loop(target, prepared, arrivals)
            at, done = await later
        report = watch.report()
        firsts = [watch.first_busy[i] for i in plan.event_engines]
        report["first_busy_after_event_s"] = [None if t is None else round(t - done, 2) for t in firsts]
        report["event_at_s"] = at - begun
        report["event_took_s"] = done - at
        return target.turns, report  # type: ignore[return-value]
    finally:
        target.close()


def _summary(records: list[Record], watch: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """Per window: requests, errors, hit rate and TTFT; then the engines' view of the add."""
    in_window = {name: [r for r in records if plan.window(r.start) == name] for name in WINDOWS}
    windows = {name: summarize(rows, 0.0, plan.duration_s, brief=True) for name, rows in in_window.items()}
    served = watch["served"]
    total = sum(served)
    return {
        "requests": len(records),
        "windows": windows,
        "served": served,
        "mean_in_flight": [round(x, 2) for x in watch["mean_in_flight"]],
        "peak_in_flight": watch["peak_in_flight"],
        "event_share": sum(served[i] for i in plan.event_engines) / total if total else None,
        "first_busy_after_event_s": watch["first_busy_after_event_s"],
        "event_late_s": watch["event_at_s"] - plan.add_at_s,
        "event_took_s": watch["event_took_s"],
        "errors": sum(w["errors"] for w in windows.values()),
    }


# --- the grid and its report -------------------------------------------------------------------------------


def _capacity(
    ctx: Context, shape_name: str, seed: int, shape: shapes.Shape, args: argparse.Namespace
) -> float:
    """SMG's closed-loop completions per second on the starting engines (round robin's without SMG)."""
    if args.rate is not None:
        return float(args.rate)
    source = suite.SMG if ctx.smg_binary is not None else suite.ROUND_ROBIN
    cell = suite.Cell(shape_name, seed, replace(ctx.config, engines=args.plan.start), "scale_out")
    run = suite.run_one(
        source,
        ctx,
        cell,
        shape,
        arrivals=None,
        duration_s=args.duration,
        warmup_s=args.warmup,
        label="capacity",
    )
    return float(run["requests_per_s"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from extproc.models import default_model_dir

    model_dir = default_model_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"scale-out-{stamp}-logs"
    ctx = run_context(args, model_dir, log_dir, replace(EngineConfig(), num_blocks=args.num_blocks))
    order = (
        ([suite.SMG] if ctx.smg_binary is not None else []) + [suite.ours(suite.OURS_DEFAULT)] + args.variants
    )
    vocab = load_vocab(model_dir / "tokenizer.json")
    plan: Plan = args.plan
    points = []
    begun = time.monotonic()
    for name in args.shapes:
        for seed in args.seeds:
            shape = shapes.make_shape(name, vocab, seed)
            capacity = _capacity(ctx, name, seed, shape, args)
            for load in args.loads:
                rate = load * capacity
                arrivals = suite.open_loop_arrivals(rate, plan.duration_s, seed)
                for repeat in range(args.repeats):
                    runs = []
                    for gw in order:
                        print(
                            f"  {name} seed {seed} {load:.0%} (run {repeat + 1}), {gw.name}", file=sys.stderr
                        )
                        where = log_dir / f"{name}-s{seed}-open{int(load * 100)}-r{repeat}-{gw.name}"
                        try:
                            runs.append(run_one(gw, ctx, shape, plan, arrivals, where))
                        except (StartError, OSError, RuntimeError) as exc:
                            runs.append({"gateway": gw.name, "failed": str(exc)[-500:]})
                    points.append(
                        {
                            "shape": name,
                            "seed": seed,
                            "load": load,
                            "rate": rate,
                            "capacity": capacity,
                            "repeat": repeat,
                            "runs": runs,
                        }
                    )
                    _write(args, stamp, begun, points)
    path = _write(args, stamp, begun, points)
    print(markdown(json.loads(path.read_text())))
    print(f"results in {path}")
    return 0


def _write(args: argparse.Namespace, stamp: str, begun: float, points: list[dict[str, Any]]) -> Path:
    doc = {
        "started_at": stamp,
        "wall_s": time.monotonic() - begun,
        "plan": vars(args.plan),
        "settings": {"argv": sys.argv[1:], "num_blocks": args.num_blocks, "smg_args": args.smg_args},
        "points": points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"scale-out-{stamp}.json"
    path.write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(doc))
    return path


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}"


def markdown(doc: dict[str, Any]) -> str:
    """One row per run: each window's mean TTFT (and over SMG's), p90 over SMG's and hit rate, then the
    added engines' share and first request. Points where ours is slowest after the add come first."""
    plan = doc["plan"]
    if plan.get("event", "add") == "restart":
        title = f"# Restart: {plan['start']} engines, engine 0 restarted at {plan['add_at_s']:.0f} s"
        title += f" (down {plan['down_s']:g} s)"
        share, first = "restarted share", "first request after back s"
    else:
        title = f"# Scale-out: {plan['start']} engines, {plan['add']} added at {plan['add_at_s']:.0f} s"
        share, first = "added share", "first request s"
    lines = [
        f"{title} (joining: the {plan['settle_s']:.0f} s after), {plan['duration_s']:.0f} s runs",
        "",
        "| shape | seed | load | gateway | before ms | joining ms (/SMG, p90 /SMG) "
        f"| after ms (/SMG, p90 /SMG) | hits before / joining / after % | {share} | {first} "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def after_ratio(point: dict[str, Any]) -> float:
        runs = {r["gateway"]: r for r in point["runs"] if "failed" not in r}
        smg, ours = runs.get("smg"), runs.get(suite.OURS_DEFAULT)
        if not smg or not ours:
            return 0.0
        a, b = ours["windows"]["joining"]["ttft_ms"]["mean"], smg["windows"]["joining"]["ttft_ms"]["mean"]
        return a / b if b else 0.0

    for point in sorted(doc["points"], key=after_ratio, reverse=True):
        runs = {r["gateway"]: r for r in point["runs"]}
        smg = runs.get("smg", {}).get("windows")
        for run in point["runs"]:
            head = f"| {point['shape']} | {point['seed']} | {point['load']:.0%} | {run['gateway']} "
            if "failed" in run:
                lines.append(head + "| failed |" + " |" * 6)
                continue
            w = run["windows"]
            cells = [f"{w['before']['ttft_ms']['mean']:.0f}"]
            for name in ("joining", "after"):
                mean, p90 = w[name]["ttft_ms"]["mean"], w[name]["ttft_ms"]["p90"]
                if smg and run["gateway"] != "smg":
                    s = smg[name]["ttft_ms"]
                    cells.append(f"{mean:.0f} ({_ratio(mean, s['mean'])}, {_ratio(p90, s['p90'])})")
                else:
                    cells.append(f"{mean:.0f}")
            hits = " / ".join(_pct(w[n]["hit_rate"]) for n in WINDOWS)
            firsts = ", ".join("-" if t is None else f"{t:.1f}" for t in run["first_busy_after_event_s"])
            lines.append(
                head + "| " + " | ".join(cells) + f" | {hits} | {_pct(run['event_share'])}% | {firsts} "
                f"| {run['errors']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
