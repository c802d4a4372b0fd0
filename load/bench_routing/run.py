"""One benchmark run: fresh engines, one gateway with one policy, the trace sent open loop, then the
numbers; and the capacity probe that sets the trace's rate.

Every run starts its own simulator process (so no run inherits another's KV cache), the index probe
(our prefix index fed by the same engines' events, for its memory per block), then the gateway; the
trace is sent open loop while `EngineWatch` samples the engines; then everything is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load.bench.procs import Child, cpu_seconds, spawn, wait_for
from load.bench.run import machine_busy_s
from load.bench_routing import gateways
from load.bench_routing.engines import EngineConfig, EngineWatch, http_get, start_engines
from load.bench_routing.target import RoutingTarget
from load.bench_routing.trace import RoutedSpec, Trace
from load.loadgen.progress import Progress
from load.loadgen.records import Record, percentile
from load.loadgen.runner import closed_loop, open_loop

SMG_METRICS = ("smg_kv_index_", "smg_kv_event_", "smg_cache_aware_")
_LABEL = re.compile(r'(?:disposition|op|branch)="(\w+)"')


@dataclass(frozen=True)
class RunSpec:
    """What runs: ours with a policy, or SMG with its cache-aware policy."""

    gateway: str  # "ours" | "smg"
    policy: str

    @property
    def name(self) -> str:
        return self.policy if self.gateway == "ours" else f"smg {self.policy}"


@dataclass(frozen=True)
class Context:
    config: EngineConfig
    model: str
    model_dir: Path
    log_dir: Path
    envoy_concurrency: int
    smg_binary: Path | None
    smg_extra: tuple[str, ...] = ()


def run_context(args: argparse.Namespace, model_dir: Path, log_dir: Path, config: EngineConfig) -> Context:
    """What every run of a benchmark shares, from its `--no-smg`, `--smg-venv`, `--smg-args` and
    `--envoy-concurrency` (SMG installed on first use)."""
    from extproc.models import served_model_name

    return Context(
        config=config,
        model=served_model_name(model_dir),
        model_dir=model_dir,
        log_dir=log_dir,
        envoy_concurrency=args.envoy_concurrency,
        smg_binary=gateways.smg_binary(args.no_smg, args.smg_venv, log_dir),
        smg_extra=tuple(shlex.split(args.smg_args)),
    )


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def _start_probe(engine_addresses: list[str], log_dir: Path) -> Child:
    argv = [sys.executable, "-m", "load.bench_routing.index_probe"]
    for address in engine_addresses:
        argv += ["--engine", address]
    child = spawn("index-probe", argv, log_dir)
    wait_for(child, lambda: "index probe subscribed" in child.log.read_text(errors="replace"), "subscription")
    return child


def _probe_result(child: Child) -> dict[str, Any] | None:
    child.stop()
    for line in reversed(child.log.read_text(errors="replace").splitlines()):
        if line.startswith("INDEX "):
            result: dict[str, Any] = json.loads(line[len("INDEX ") :])
            return result
    return None


def _start_gateway(spec: RunSpec, ctx: Context, engines: list[str], log_dir: Path) -> gateways.Started:
    if spec.gateway == "smg":
        if ctx.smg_binary is None:
            raise RuntimeError("SMG is not installed")
        return gateways.start_smg(ctx.smg_binary, engines, ctx.model_dir, ctx.model, log_dir, ctx.smg_extra)
    return gateways.start_ours(spec.policy, engines, ctx.model, log_dir, ctx.envoy_concurrency)


def run_trace(spec: RunSpec, ctx: Context, trace: Trace, warmup_s: float) -> dict[str, Any]:
    """The whole run on fresh processes; returns its summary."""
    log_dir = ctx.log_dir / _slug(spec.name)  # each run's child logs apart
    engines = start_engines(ctx.config, log_dir)
    probe: Child | None = None
    index: dict[str, Any] | None = None
    try:
        probe = _start_probe(engines.addresses, log_dir)
        started = _start_gateway(spec, ctx, engines.addresses, log_dir)
        try:
            measured = asyncio.run(_send(spec, started, ctx, engines.metrics_ports, trace))
        finally:
            started.gateway.stop()
    finally:
        if probe is not None:
            index = _probe_result(probe)
        engines.stop()
    records, watch, smg_metrics, wall_s = measured
    summary = summarize(records, warmup_s, trace.duration_s)
    summary["floor"] = floor_summary(records, warmup_s, ctx.config)
    summary["by_kind"] = {
        kind: summarize([r for r in records if r.kind == kind], warmup_s, trace.duration_s, brief=True)
        for kind in sorted({r.kind for r in records})
    }
    out: dict[str, Any] = {
        "run": spec.name,
        "gateway": spec.gateway,
        "policy": spec.policy,
        "wall_s": wall_s,
        "summary": summary,
        "engines": {**watch, "cache_turnover": cache_turnover(watch, ctx.config)},
        "index": index_memory(index, smg_metrics, spec.gateway),
        "requests": per_request(records, trace),
    }
    if smg_metrics is not None:
        out["smg_metrics"] = smg_metrics
        out["smg_kv_streams"] = gateways.smg_kv_streams(log_dir / "smg.log")
    return out


async def _send(
    spec: RunSpec, started: gateways.Started, ctx: Context, ports: list[int], trace: Trace
) -> tuple[list[Record], dict[str, Any], dict[str, float] | None, float]:
    target = RoutingTarget(started.gateway.base_url, ctx.model)
    try:
        prepared = [target.prepare(s) for s in trace.specs]
        progress = Progress(f"  {spec.name:<18}", len(prepared))
        begun = time.monotonic()
        async with EngineWatch(ports) as watch:
            result = await open_loop(target, prepared, trace.arrivals, progress=progress)
        wall_s = time.monotonic() - begun
        smg = await smg_index_metrics(started.metrics_port) if started.metrics_port else None
        return result.records, watch.report(), smg, wall_s
    finally:
        target.close()


def floor_summary(records: Sequence[Record], warmup_s: float, config: EngineConfig) -> dict[str, Any]:
    """What routing can still win: each measured request's floor is one prefill step over the prompt
    tokens its engine did not have cached, with no wait (the timing model's `prefill_s`); the TTFT above
    it is waiting (the engine's step in progress, other prompts' prefill, queues) and transport. A
    better hit rate lowers the floor; better load spreading lowers what sits above it."""
    floors, over = [], []
    for r in records:
        if r.start < warmup_s or not r.ok or r.ttft is None or r.prompt_tokens is None:
            continue
        floor = config.prefill_s(r.prompt_tokens - (r.cached_tokens or 0))
        floors.append(floor)
        over.append(r.ttft - floor)
    return {"floor_ms": _ms(floors)["mean"], "over_floor_ms": _ms(over)}


def per_request(records: Sequence[Record], trace: Trace) -> list[list[Any]]:
    """Each request in arrival order as [due s, shared part, prompt tokens, cached tokens, TTFT ms]
    (None where it failed): enough to find which misses cost a run its mean."""
    by_due = {r.start: r for r in records}
    rows: list[list[Any]] = []
    for due, spec in zip(trace.arrivals, trace.specs, strict=True):
        r = by_due.get(due)
        ttft = None if r is None or r.ttft is None else round(1000 * r.ttft, 1)
        rows.append([round(due, 3), spec.shares, spec.prompt_tokens, r and r.cached_tokens, ttft])
    return rows


def cache_turnover(watch: dict[str, Any], config: EngineConfig) -> list[float]:
    """Per engine: blocks it filled (uncached prompt and generated tokens) over its capacity. Above 1,
    the engine must have evicted cached blocks to make room (a freed block is only reused when evicted)."""
    filled = zip(
        watch["engine_prompt_tokens"],
        watch["engine_cached_tokens"],
        watch["engine_generated_tokens"],
        strict=True,
    )
    return [(p - c + g) / config.block_size / config.num_blocks for p, c, g in filled]


def _ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(1000 * v for v in values)
    if not ordered:
        return {"count": 0, **dict.fromkeys(("mean", "p10", "p50", "p90", "p99"), math.nan)}
    return {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "p10": percentile(ordered, 10),
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
    }


def summarize(
    records: Sequence[Record],
    warmup_s: float,
    end_s: float,
    *,
    brief: bool = False,
) -> dict[str, Any]:
    """The measured window: requests that arrived after the warm-up (caches filled, queues formed).
    Throughput counts every request that completed from the warm-up's end to the trace's (`end_s`): a
    run that falls behind delivers less in that window, and the drain after the last arrival is left out."""
    window = [r for r in records if r.start >= warmup_s]
    ok = [r for r in window if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    hit = sum(r.cached_tokens or 0 for r in ok)
    out: dict[str, Any] = {
        "requests": len(window),
        "ok": len(ok),
        "errors": len(window) - len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": hit,
        "hit_rate": hit / prompt if prompt else math.nan,
        "ttft_ms": _ms([r.ttft for r in ok if r.ttft is not None]),
    }
    if brief:
        return out
    done = [r for r in records if r.ok and warmup_s <= r.start + r.latency <= end_s]
    span = max(end_s - warmup_s, 1e-9)
    out["latency_ms"] = _ms([r.latency for r in ok])
    out["requests_per_s"] = len(done) / span
    out["output_tokens_per_s"] = sum(r.output_tokens or 0 for r in done) / span
    out["error_samples"] = sorted({r.error or "" for r in window if not r.ok})[:5]
    # Decoding, per request (its answer's pace) and per gap between streamed chunks (where a prefill
    # on the same engine stalls a decode: the pauses a reader sees).
    out["tpot_ms"] = _ms([t for r in ok if (t := time_per_output_token(r)) is not None])
    out["itl_ms"] = _ms([gap for r in ok for gap in r.itl])
    return out


def time_per_output_token(r: Record) -> float | None:
    """Seconds per token after the first: (end to end - TTFT) / (tokens - 1); None below two tokens."""
    if r.ttft is None or not r.output_tokens or r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


async def smg_index_metrics(port: int) -> dict[str, float]:
    """SMG's KV-index and KV-event gauges and counters, summed per name over labels."""
    try:
        text = await http_get(port, "/metrics", timeout_s=5.0)
    except (OSError, TimeoutError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(SMG_METRICS) or "_seconds" in line:
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        # Counters split by what happened (applied/load_only batches, stored/removed blocks) keep it.
        kind = _LABEL.search(name)
        if kind:
            base += ":" + kind.group(1)
        try:
            out[base] = out.get(base, 0.0) + float(value)
        except ValueError:
            continue
    return out


def index_memory(probe: dict[str, Any] | None, smg: dict[str, float] | None, gateway: str) -> dict[str, Any]:
    """Bytes per cached block: ours measured by the index probe on this run's events (the index with its
    per-engine hash maps, at the peak block count); SMG's from its own arena/slab gauges if it has them."""
    out: dict[str, Any] = {}
    if probe:
        peak = probe.get("peak") or {}
        blocks, memory = peak.get("event_blocks", 0), peak.get("memory_bytes", 0)
        out["ours_blocks"] = blocks
        out["ours_memory_bytes"] = memory
        out["ours_bytes_per_block"] = memory / blocks if blocks else None
        out["probe_batches"] = probe.get("batches")
    if gateway == "smg" and smg:
        blocks = smg.get("smg_kv_index_blocks_live") or smg.get("smg_kv_index_blocks") or 0
        memory = smg.get("smg_kv_index_arena_bytes", 0) + smg.get("smg_kv_index_slab_bytes", 0)
        out["smg_blocks"] = blocks
        out["smg_memory_bytes"] = memory
        out["smg_bytes_per_block"] = memory / blocks if blocks and memory else None
    return out


def measure_capacity(
    spec: RunSpec, ctx: Context, specs: Sequence[RoutedSpec], probe_s: float, concurrency: int
) -> dict[str, Any]:
    """Closed loop through one gateway and policy on fresh engines: the completion rate over the probe's
    last three quarters (the first quarter fills queues and caches)."""
    log_dir = ctx.log_dir / f"capacity-{_slug(spec.name)}"
    engines = start_engines(ctx.config, log_dir)
    try:
        started = _start_gateway(spec, ctx, engines.addresses, log_dir)
        try:
            pids = [engines.child.pid, *started.gateway.processes.values()]
            probe = asyncio.run(_probe_capacity(started, ctx, specs, probe_s, concurrency, pids))
            return {"run": spec.name, **probe}
        finally:
            started.gateway.stop()
    finally:
        engines.stop()


async def _probe_capacity(
    started: gateways.Started,
    ctx: Context,
    specs: Sequence[RoutedSpec],
    probe_s: float,
    concurrency: int,
    pids: list[int],
) -> dict[str, Any]:
    target = RoutingTarget(started.gateway.base_url, ctx.model)
    try:
        prepared = [target.prepare(s) for s in specs]
        machine0, own0, t0 = machine_busy_s(), _own_cpu_s(pids), time.monotonic()
        progress = Progress(f"  capacity c={concurrency}", len(prepared))
        result = await closed_loop(target, prepared, concurrency, duration_s=probe_s, progress=progress)
        capacity_s = max(time.monotonic() - t0, 1e-9) * _cpus()
        machine_share = (machine_busy_s() - machine0) / capacity_s
        own_share = (_own_cpu_s(pids) - own0) / capacity_s
    finally:
        target.close()
    lo, hi = probe_s / 4, probe_s
    done = [r for r in result.records if r.ok and lo <= r.start + r.latency <= hi]
    ok = [r for r in result.records if r.ok]
    return {
        "concurrency": concurrency,
        "probe_s": probe_s,
        "requests_per_s": len(done) / (hi - lo),
        "completed": len(ok),
        "errors": len(result.records) - len(ok),
        # Near 1 the probe measured the machine, not the engines: the trace's rate would be too low.
        "own_cpu_share": own_share,
        "machine_cpu_share": machine_share,
        "ttft_ms": _ms([r.ttft for r in ok if r.ttft is not None]),
    }


def _own_cpu_s(pids: list[int]) -> float:
    """CPU seconds of the engines, the gateway (with descendants) and this client so far."""
    return cpu_seconds(pids) + time.process_time()


def _cpus() -> int:
    from load.bench.gateways import cpu_count

    return cpu_count()
