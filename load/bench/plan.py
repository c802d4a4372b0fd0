"""What a benchmark run does: which workloads, how many requests per phase, at what concurrency.

Every (target, workload) gets two closed-loop phases on the same prompts for every target:
- latency: one client, so latency is the path's own, not queueing; added latency = target - floor.
- throughput: enough clients to saturate this machine; its completion rate is the maximum sustained
  requests/s, and the gateway CPU it burned divided by the requests it completed is the CPU per request.
Request counts are sized so each phase runs several seconds on a 2-core machine (a phase also stops
sending after max_phase_s, whichever comes first).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class WorkloadPlan:
    name: str
    latency_requests: int
    throughput_requests: int
    # The loadgen workload it sends (default: `name`): two plans may send one workload on differently
    # timed engines.
    shape: str | None = None
    # The engines' timing while it runs (simulator /timing fields); empty: the fast mode (no engine time).
    engine_timing: tuple[tuple[str, float], ...] = ()
    # Clients of its throughput phase (default: the plan's).
    throughput_concurrency: int | None = None

    @property
    def workload(self) -> str:
        return self.shape or self.name

    @property
    def timing(self) -> dict[str, float] | None:
        return dict(self.engine_timing) or None


def stepped(tokens_per_message: int, step_ms: float = 2.0) -> tuple[tuple[str, float], ...]:
    """Engines that stream as a real one does: a `step_ms` decode step between messages, each carrying
    `tokens_per_message` tokens (prefill as cheap as a step; no per-sequence step cost, so 16 clients see
    the same pace as one)."""
    timing = {"ttft_ms": step_ms, "itl_ms": step_ms, "prefill_ms_per_token": 0.0, "decode_ms_per_seq": 0.0}
    return tuple({**timing, "time_scale": 1.0, "tokens_per_message": tokens_per_message}.items())


# Issue 17's long-stream workloads: 16 clients, 2 ms steps, one token per engine message, and the same
# with 4 tokens per message (so the figure does not rest on one chunking).
LONG_STREAM_CLIENTS = 16
LONG_STREAMS = (
    WorkloadPlan("stream-256", 10, 240, "stream-256", stepped(1), LONG_STREAM_CLIENTS),
    WorkloadPlan("stream-16", 60, 800, "chat-stream", stepped(1), LONG_STREAM_CLIENTS),
    WorkloadPlan("stream-256x4", 10, 240, "stream-256", stepped(4), LONG_STREAM_CLIENTS),
    WorkloadPlan("stream-16x4", 60, 800, "chat-stream", stepped(4), LONG_STREAM_CLIENTS),
)


@dataclass(frozen=True)
class Plan:
    workloads: tuple[WorkloadPlan, ...]
    warmup_requests: int = 16
    latency_concurrency: int = 1
    throughput_concurrency: int = 8
    max_phase_s: float = 30.0
    # The whole plan is repeated; the report takes each number's median over rounds (noise from other
    # work on shared machines comes in bursts, and a median shrugs off one bad round).
    rounds: int = 1
    # Engines in the simulator; both gateways balance round-robin over them.
    engines: int = 2
    max_model_len: int = 40000

    def only(self, names: set[str]) -> Plan:
        return replace(self, workloads=tuple(w for w in self.workloads if w.name in names))


FULL = Plan(
    workloads=(
        WorkloadPlan("chat", 1000, 5000),
        WorkloadPlan("chat-stream", 600, 2500),
        WorkloadPlan("rag-6k", 150, 500),
        WorkloadPlan("rag-30k", 40, 120),
        WorkloadPlan("multi-turn", 300, 1200),
        WorkloadPlan("mix", 400, 2000),
        # Agent traffic: a streamed tool call and the same-length plain stream (gateway CPU ratio).
        WorkloadPlan("tool-stream", 300, 1200),
        WorkloadPlan("plain-stream", 300, 1200),
        *LONG_STREAMS,
    ),
    rounds=3,
)


def scaled(plan: Plan, factor: float, *, minimum: int = 8, max_phase_s: float | None = None) -> Plan:
    """The plan with request counts times `factor` (at least `minimum` per phase, twice that at load)."""
    workloads = tuple(
        replace(
            w,
            latency_requests=max(minimum, int(w.latency_requests * factor)),
            throughput_requests=max(2 * minimum, int(w.throughput_requests * factor)),
        )
        for w in plan.workloads
    )
    return replace(
        plan,
        workloads=workloads,
        warmup_requests=min(plan.warmup_requests, max(minimum, int(plan.warmup_requests * factor))),
        max_phase_s=max_phase_s or plan.max_phase_s * max(factor, 1.0),
    )


def with_rounds(plan: Plan, rounds: int) -> Plan:
    return replace(plan, rounds=rounds)


# A smoke test of the whole harness in a minute or two: same shape, a quarter of the requests.
QUICK = with_rounds(scaled(FULL, 1 / 4, max_phase_s=6.0), 1)
