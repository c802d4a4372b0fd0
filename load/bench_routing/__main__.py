"""`python -m load.bench_routing`: which engine-picking policy wins, on simulated engines where prefill is
the cost and the KV cache is too small for one engine to hold every shared prefix.

1. Capacity: closed-loop probes on fresh engines measure the requests/s the four engines sustain on this
   trace's requests: through ours with round_robin (the cache-blind baseline, whose capacity sets the
   rate by default), with kv_events, and through SMG cache_aware (ours against SMG at saturation: the
   benchmark's throughput comparison, since open loop every run's throughput is the arrival rate).
2. The trace: Poisson arrivals at --load (0.7) times the capacity, mixing multi-turn chats, users sharing
   a few long system prompts and RAG over a shared document set (load/bench_routing/trace.py).
3. One run per policy of ours and one of SMG with --policy cache_aware, each on freshly started engines,
   all with the same trace. Reported over the requests that arrived after the warm-up: prefix-hit token
   rate, mean and p90 TTFT, throughput, requests served and peak in flight per engine, index bytes per
   cached block; ratios to SMG cache_aware, and the issue's targets for kv_events.

Results go to load/results/routing-<time>.json (and routing-latest.json). See docs/routing-benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from load.bench import gateways as bench_gateways
from load.bench_routing import report, trace
from load.bench_routing.engines import EngineConfig
from load.bench_routing.gateways import POLICIES, SMG_POLICY
from load.bench_routing.run import Context, RunSpec, measure_capacity, run_context, run_trace
from load.loadgen.records import json_safe
from load.loadgen.text import load_vocab

DEFAULT_OUT = bench_gateways.ROOT / "load" / "results"


@dataclass(frozen=True)
class Mode:
    duration_s: float  # the trace
    warmup_s: float  # arrivals not measured
    probe_s: float  # the capacity probe
    policies: tuple[str, ...]  # ours


FULL = Mode(50.0, 10.0, 16.0, POLICIES)
QUICK = Mode(18.0, 5.0, 8.0, ("kv_events", "round_robin"))
PROBE_CONCURRENCY = 32
PROBE_REQUESTS = 2000  # more than a probe completes: it ends on time
BASELINE = RunSpec("ours", "round_robin")
CAPACITY_FROM = ("smg", "round_robin")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m load.bench_routing", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="kv_events, round_robin and SMG, short: ~2 min")
    parser.add_argument(
        "--policies", default=None, help=f"comma list of ours (default all): {','.join(POLICIES)}"
    )
    parser.add_argument("--no-smg", action="store_true", help="leave SMG out")
    parser.add_argument("--duration", type=float, default=None, help="trace seconds (default 50, quick 18)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds not measured (default 10, quick 5)"
    )
    parser.add_argument("--load", type=float, default=0.7, help="arrival rate as a share of capacity (0.7)")
    parser.add_argument("--rate", type=float, default=None, help="requests/s; skips the capacity probes")
    parser.add_argument(
        "--capacity-from",
        choices=CAPACITY_FROM,
        default="round_robin",
        help="whose closed-loop capacity --load is a share of: round_robin (the cache-blind baseline, the "
        "default) or smg (cache_aware; a heavier load: caching lifts capacity)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-blocks", type=int, default=EngineConfig.num_blocks, help="KV blocks per engine"
    )
    parser.add_argument(
        "--time-scale", type=float, default=EngineConfig.time_scale, help="engine time multiplier"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory (load/results)")
    parser.add_argument("--smg-venv", type=Path, default=bench_gateways.DEFAULT_SMG_VENV)
    parser.add_argument(
        "--smg-args",
        default="",
        help="extra flags for smg launch, one string (e.g. '--disable-worker-overload-protection')",
    )
    parser.add_argument("--envoy-concurrency", type=int, default=bench_gateways.cpu_count())
    args = parser.parse_args(argv)
    mode = QUICK if args.quick else FULL
    args.duration = args.duration or mode.duration_s
    args.warmup = mode.warmup_s if args.warmup is None else args.warmup
    args.probe_s = mode.probe_s
    if args.policies:
        args.policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        unknown = set(args.policies) - set(POLICIES)
        if unknown or not args.policies:
            parser.error(f"--policies: unknown {', '.join(sorted(unknown)) or '(none given)'}")
    else:
        args.policies = mode.policies
    if args.warmup >= args.duration:
        parser.error("--warmup must be shorter than --duration")
    if not 0 < args.load <= 2:
        parser.error("--load must be in (0, 2]")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    args.config = replace(EngineConfig(), num_blocks=args.num_blocks, time_scale=args.time_scale)
    return args


def run_order(policies: Sequence[str], smg: bool) -> list[RunSpec]:
    """kv_events, then SMG, then the rest: the two the targets compare run back to back."""
    ours = [RunSpec("ours", p) for p in policies]
    if smg:
        ours.insert(1 if ours and ours[0].policy == "kv_events" else 0, RunSpec("smg", SMG_POLICY))
    return ours


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from extproc.models import default_model_dir

    model_dir = default_model_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"routing-{stamp}-logs"
    begun = time.monotonic()
    vocab = load_vocab(model_dir / "tokenizer.json")
    ctx = run_context(args, model_dir, log_dir, args.config)

    capacity: dict[str, Any] | None = None
    rate = args.rate
    if rate is None:
        capacity = probe_capacities(args, ctx, vocab)
        rate = args.load * capacity["probes"][capacity["from"]]["requests_per_s"]
    the_trace = trace.build_trace(vocab, rate=rate, duration_s=args.duration, seed=args.seed)
    print(
        f"trace: {len(the_trace)} requests at {rate:.2f}/s for {args.duration:.0f} s "
        f"(first {args.warmup:.0f} s not measured)",
        file=sys.stderr,
    )

    runs: list[dict[str, Any]] = []
    for spec in run_order(args.policies, ctx.smg_binary is not None):
        print(f"run {spec.name}", file=sys.stderr, flush=True)
        runs.append(run_trace(spec, ctx, the_trace, args.warmup))

    checks = report.targets(runs)
    result = {
        "started_at": stamp,
        "quick": args.quick,
        "wall_s": time.monotonic() - begun,
        "environment": environment(args, ctx),
        "capacity": capacity,
        "trace": {
            "requests": len(the_trace),
            "rate": rate,
            "load": args.load if args.rate is None else None,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "seed": args.seed,
            "prompt_tokens_mean": the_trace.prompt_tokens() / max(len(the_trace), 1),
            "kinds": {k: sum(1 for s in the_trace.specs if s.kind == k) for k, _ in trace.MIX},
            "working_set_tokens": trace.working_set_tokens(),
            "engine_cache_tokens": args.config.cache_tokens,
        },
        "targets": checks,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"routing-{stamp}.json"
    path.write_text(json.dumps(json_safe(result), indent=2) + "\n")
    shutil.copyfile(path, args.out / "routing-latest.json")

    print()
    if capacity:
        print(report.capacity_text(capacity, rate, args.load))
    print(report.table(runs))
    print()
    print(report.by_kind_table(runs))
    print()
    print(report.floor_table(runs))
    print()
    print(report.engines_table(runs))
    print()
    print(report.targets_text(checks))
    print(f"wall time {result['wall_s']:.0f} s; results in {path}")
    return 0


def probe_capacities(args: argparse.Namespace, ctx: Context, vocab: Any) -> dict[str, Any]:
    """Closed-loop capacity through round_robin, kv_events (when it runs) and SMG cache_aware (when SMG
    is here); `from` names the one --load is a share of. Ours and SMG's side by side are the
    benchmark's throughput comparison: open loop, every run's throughput is the arrival rate."""
    runs = [BASELINE]
    if "kv_events" in args.policies:
        runs.append(RunSpec("ours", "kv_events"))
    if ctx.smg_binary is not None:
        runs.append(RunSpec("smg", SMG_POLICY))
    source = "smg" if args.capacity_from == "smg" and ctx.smg_binary is not None else "round_robin"
    if source != args.capacity_from:
        print("capacity from round_robin: SMG is not available", file=sys.stderr)
    probe_specs = trace.requests(vocab, PROBE_REQUESTS, seed=args.seed + 1000)
    probes: dict[str, Any] = {}
    for spec in runs:
        print(f"capacity probe: {spec.name}, closed loop, {PROBE_CONCURRENCY} clients", file=sys.stderr)
        key = "smg" if spec.gateway == "smg" else spec.policy
        probes[key] = measure_capacity(spec, ctx, probe_specs, args.probe_s, PROBE_CONCURRENCY)
    mean_prompt = sum(s.prompt_tokens for s in probe_specs) / len(probe_specs)
    return {
        "from": source,
        "concurrency": PROBE_CONCURRENCY,
        "probes": probes,
        "zero_hit_requests_per_s": args.config.zero_hit_capacity(mean_prompt),
    }


def environment(args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    from load.bench.__main__ import environment as bench_environment

    bench_args = argparse.Namespace(
        envoy_concurrency=args.envoy_concurrency, targets=["ours"] + (["smg"] if ctx.smg_binary else [])
    )
    return {
        **bench_environment(bench_args),
        "engines": asdict(args.config),
        "smg_args": list(ctx.smg_extra),
        "engines_argv": args.config.argv()[1:],
    }


if __name__ == "__main__":
    sys.exit(main())
