"""`python -m load.loadgen`: load an OpenAI-compatible server and report TTFT, ITL, latency, throughput.

    python -m load.loadgen --url http://127.0.0.1:8080 --workload chat --concurrency 8 --requests 2000
    python -m load.loadgen --url ... --workload mix --rate 50 --requests 3000        # open loop, Poisson
    python -m load.loadgen --url ... --workload rag-6k --trace arrivals.txt          # open loop, a trace

Prints the summary and writes it (with every request's record if --records) as JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load.loadgen.openai_target import OpenAITarget
from load.loadgen.progress import Progress
from load.loadgen.records import json_safe
from load.loadgen.runner import RunResult, closed_loop, load_trace, open_loop, poisson_arrivals
from load.loadgen.text import load_vocab
from load.loadgen.workloads import SHAPES, WORKLOADS, Workload


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    shapes = "; ".join(f"{name}: {shape.description}" for name, shape in SHAPES.items())
    parser = argparse.ArgumentParser(
        prog="python -m load.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Workloads: {shapes}; mix: a weighted mix of these.",
    )
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--workload", default="chat", choices=WORKLOADS)
    parser.add_argument("--requests", type=int, default=1000, help="requests to send (at most)")
    parser.add_argument("--duration", type=float, default=None, help="closed loop: stop sending after S s")
    loop = parser.add_mutually_exclusive_group()
    loop.add_argument("--concurrency", type=int, default=8, help="closed loop: clients (default 8)")
    loop.add_argument("--rate", type=float, default=None, help="open loop: Poisson arrivals per second")
    loop.add_argument("--trace", type=Path, default=None, help="open loop: file of arrival times (s)")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument("--stream", dest="stream", action="store_true", default=None)
    stream.add_argument("--no-stream", dest="stream", action="store_false")
    parser.add_argument("--max-tokens", type=int, default=None, help="answer length (default 16)")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly max-tokens tokens (vLLM extension)"
    )
    parser.add_argument("--seed", type=int, default=0, help="prompts are a function of the seed")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent first and not measured")
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    parser.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    parser.add_argument("--records", action="store_true", help="include every request's record in --out")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    return args


def discover_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as resp:
        models = json.load(resp)["data"]
    if not models:
        raise SystemExit(f"{url} serves no models")
    return str(models[0]["id"])


def format_summary(summary: dict[str, Any]) -> str:
    def dist(name: str) -> str:
        d = summary[name]
        if not d["count"]:
            return f"{name:<11} -"
        cols = "  ".join(f"{p} {d[p]:8.2f}" for p in ("p50", "p90", "p99", "max"))
        return f"{name:<11} {cols}"

    lines = [
        f"requests    {summary['requests']} ok {summary['ok']} errors {summary['errors']} "
        f"{summary['errors_by_cause'] or ''}",
        f"throughput  {summary['requests_per_s']:.1f} req/s  "
        f"{summary['output_tokens_per_s']:.0f} output tok/s  over {summary['wall_s']:.1f} s",
        dist("latency_ms"),
        dist("ttft_ms"),
        dist("itl_ms"),
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from extproc.models import default_model_dir  # the tokenizer whose vocabulary prompts are drawn from

    model = args.model or discover_model(args.url)
    vocab = load_vocab(default_model_dir() / "tokenizer.json")
    workload = Workload(args.workload, seed=args.seed, stream=args.stream, max_tokens=args.max_tokens)
    target = OpenAITarget(args.url, model, timeout_s=args.timeout, ignore_eos=args.ignore_eos)
    arrivals = None
    count = args.requests
    if args.trace:
        arrivals = load_trace(args.trace)[: args.requests]
        count = len(arrivals)
    elif args.rate:
        arrivals = poisson_arrivals(args.rate, count, seed=args.seed)
    # Prompts are built before the clock starts: the run spends client CPU on the wire only.
    measured = [target.prepare(s) for s in workload.specs(vocab, count)]
    try:
        if args.warmup:
            warm = [target.prepare(s) for s in workload.with_seed(args.seed + 1).specs(vocab, args.warmup)]
            await closed_loop(target, warm, min(args.concurrency, args.warmup))
        progress = Progress(args.workload, count, enabled=not args.no_progress)
        started = time.time()
        result: RunResult
        if arrivals is None:
            result = await closed_loop(
                target, measured, args.concurrency, duration_s=args.duration, progress=progress
            )
        else:
            result = await open_loop(target, measured, arrivals, progress=progress)
    finally:
        target.close()
    mode: dict[str, Any] = (
        {"loop": "closed", "concurrency": args.concurrency}
        if arrivals is None
        else {"loop": "open", "rate": args.rate, "trace": str(args.trace) if args.trace else None}
    )
    out: dict[str, Any] = {
        "url": args.url,
        "model": model,
        "workload": args.workload,
        "seed": args.seed,
        "started_at": started,
        **mode,
        "summary": result.summary(),
    }
    if args.records:
        out["records"] = [dataclasses.asdict(r) for r in result.records]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = asyncio.run(run(args))
    print(format_summary(out["summary"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(json_safe(out), indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 1 if out["summary"]["ok"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
