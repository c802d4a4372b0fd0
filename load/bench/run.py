"""Run a plan: every workload against every target in turn, measuring latency, throughput and CPU.

Targets take turns per workload (floor, then ours and SMG in alternating order), so slow drift in the
machine's state (other work on the shared cores, thermal) spreads over both gateways instead of landing
on one. Each phase records the CPU seconds of the gateway's processes, of the engines and of this client,
and of the whole machine, so CPU spent by anything else during the phase (noise) is visible. Each phase
also keeps its latency and TTFT quantiles (`cdf_ms`), which the latency CDF plots are drawn from.

A concurrency sweep (`run_sweep`) runs one workload closed loop at each of several client counts, each
level time-boxed, with the targets alternating per level as above: requests/s and latency per level are
the throughput-vs-concurrency curve.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from load.bench.plan import Plan, WorkloadPlan
from load.bench.procs import cpu_seconds
from load.loadgen.progress import Progress
from load.loadgen.records import Record, percentile
from load.loadgen.runner import Target, closed_loop
from load.loadgen.text import Vocab
from load.loadgen.workloads import ChatSpec, Workload

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# The quantiles a phase keeps for its CDF: every percent, and a finer tail (where gateways differ most).
CDF_PERCENTILES = (*range(0, 100), 99.5, 99.9, 100)


@dataclass
class BenchTarget:
    """A target and the processes whose CPU is its cost, by name (none for the floor)."""

    name: str
    target: Target
    processes: dict[str, int]

    @property
    def gateway_pids(self) -> list[int]:
        return list(self.processes.values())


@dataclass(frozen=True)
class Specs:
    warmup: list[ChatSpec]
    latency: list[ChatSpec]
    throughput: list[ChatSpec]


def build_specs(vocab: Vocab, plan: Plan, workload: WorkloadPlan, round_: int = 0) -> Specs:
    """Prompts of their own per phase and round (distinct seeds), the same for every target."""
    seed = 10 * round_
    return Specs(
        warmup=Workload(workload.workload, seed=seed + 1).specs(vocab, plan.warmup_requests),
        latency=Workload(workload.workload, seed=seed + 2).specs(vocab, workload.latency_requests),
        throughput=Workload(workload.workload, seed=seed + 3).specs(vocab, workload.throughput_requests),
    )


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all CPUs), from /proc/stat."""
    with open("/proc/stat") as file:
        fields = [int(v) for v in file.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest time is already counted in user.
    return (sum(fields[:8]) - idle) / TICKS_PER_S


def quantiles_ms(values: Sequence[float]) -> list[float]:
    """`values` (seconds) at CDF_PERCENTILES, in milliseconds; empty when there are none."""
    ordered = sorted(1000 * v for v in values)
    return [percentile(ordered, p) for p in CDF_PERCENTILES] if ordered else []


def cdf_ms(records: Sequence[Record]) -> dict[str, list[float]]:
    ok = [r for r in records if r.ok]
    return {
        "percentiles": list(CDF_PERCENTILES),
        "latency": quantiles_ms([r.latency for r in ok]),
        "ttft": quantiles_ms([r.ttft for r in ok if r.stream and r.ttft is not None]),
    }


async def run_phase(
    bench: BenchTarget,
    specs: Sequence[ChatSpec],
    concurrency: int,
    *,
    engine_pids: list[int],
    max_s: float,
    label: str,
) -> dict[str, Any]:
    prepared = [bench.target.prepare(s) for s in specs]
    progress = Progress(label, len(prepared))
    each0 = {name: cpu_seconds([pid]) for name, pid in bench.processes.items()}
    engines0, client0, machine0 = cpu_seconds(engine_pids), time.process_time(), machine_busy_s()
    result = await closed_loop(bench.target, prepared, concurrency, duration_s=max_s, progress=progress)
    each = {name: cpu_seconds([pid]) - each0[name] for name, pid in bench.processes.items()}
    gateway = sum(each.values())
    engines = cpu_seconds(engine_pids) - engines0
    client = time.process_time() - client0
    machine = machine_busy_s() - machine0
    summary = result.summary()
    done = max(summary["ok"], 1)
    capacity = max(result.wall_s, 1e-9) * (os.cpu_count() or 1)
    return {
        "concurrency": concurrency,
        "summary": summary,
        "cdf_ms": cdf_ms(result.records),
        "cpu_s": {"gateway": gateway, "engines": engines, "client": client, "machine": machine},
        "cpu_ms_per_request": {
            "gateway": 1000 * gateway / done,
            "engines": 1000 * engines / done,
            "client": 1000 * client / done,
        },
        "gateway_cpu_ms_per_request": {name: 1000 * cpu / done for name, cpu in each.items()},
        # How busy the machine was (near 1: saturated), and how much of it was none of ours (noise).
        "machine_cpu_share": machine / capacity,
        "foreign_cpu_share": max(0.0, machine - gateway - engines - client) / capacity,
    }


async def run_plan(
    plan: Plan,
    vocab: Vocab,
    targets: list[BenchTarget],
    engine_pids: list[int],
    check_alive: Any = None,
    retime: Callable[[dict[str, float] | None], None] | None = None,
) -> list[dict[str, Any]]:
    """`retime` sets the engines' timing for a workload that has its own (None: back to fast mode)."""
    results: list[dict[str, Any]] = []
    turns = [(r, i, w) for r in range(plan.rounds) for i, w in enumerate(plan.workloads)]
    timed = False
    for round_, index, workload in turns:
        if retime is not None and (workload.timing or timed):
            retime(workload.timing)
            timed = workload.timing is not None
        specs = build_specs(vocab, plan, workload, round_)
        clients = workload.throughput_concurrency or plan.throughput_concurrency
        floor = [t for t in targets if t.name == "floor"]
        gateways = [t for t in targets if t.name != "floor"]
        if (index + round_) % 2:
            gateways.reverse()
        for bench in floor + gateways:
            if check_alive:
                check_alive()
            where = f"round {round_ + 1}/{plan.rounds}: " if plan.rounds > 1 else ""
            print(f"{where}{workload.name} on {bench.name}", file=sys.stderr, flush=True)
            warm = [bench.target.prepare(s) for s in specs.warmup]
            await closed_loop(bench.target, warm, clients)
            for phase, phase_specs, concurrency in (
                ("latency", specs.latency, plan.latency_concurrency),
                ("throughput", specs.throughput, clients),
            ):
                label = f"  {phase:<10} c={concurrency:<2}"
                measured = await run_phase(
                    bench,
                    phase_specs,
                    concurrency,
                    engine_pids=engine_pids,
                    max_s=plan.max_phase_s,
                    label=label,
                )
                key = {"target": bench.name, "workload": workload.name, "phase": phase, "round": round_}
                results.append({**key, **measured})
    if retime is not None and timed:
        retime(None)
    return results


@dataclass(frozen=True)
class Sweep:
    """Closed-loop levels of one workload: `levels` clients each, at most `requests` and `level_s` each."""

    workload: str
    levels: tuple[int, ...]
    requests: int
    level_s: float
    warmup_requests: int = 16


async def run_sweep(
    sweep: Sweep,
    vocab: Vocab,
    targets: list[BenchTarget],
    engine_pids: list[int],
    check_alive: Any = None,
) -> list[dict[str, Any]]:
    """Every level on every target (floor first, gateways alternating per level), same prompts for all."""
    # Every level and target sends these from the first: a level ends at level_s or when they run out.
    specs = Workload(sweep.workload, seed=7).specs(vocab, sweep.requests)
    warmup = Workload(sweep.workload, seed=8).specs(vocab, sweep.warmup_requests)
    floor = [t for t in targets if t.name == "floor"]
    gateways = [t for t in targets if t.name != "floor"]
    for bench in targets:
        await closed_loop(bench.target, [bench.target.prepare(s) for s in warmup], max(sweep.levels))
    results: list[dict[str, Any]] = []
    for index, level in enumerate(sweep.levels):
        order = floor + (gateways[::-1] if index % 2 else gateways)
        for bench in order:
            if check_alive:
                check_alive()
            print(f"sweep {sweep.workload} c={level} on {bench.name}", file=sys.stderr, flush=True)
            measured = await run_phase(
                bench,
                specs,
                level,
                engine_pids=engine_pids,
                max_s=sweep.level_s,
                label=f"  sweep      c={level:<2}",
            )
            results.append({"target": bench.name, "workload": sweep.workload, "phase": "sweep", **measured})
    return results
