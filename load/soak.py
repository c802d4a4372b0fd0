"""`make soak`: minutes of mixed load on the real stack while things go wrong, and what clients saw.

It starts simulated engines (their own process, with fault control ports) and `extproc up` in front of
them (extproc and Envoy, supervised), then for `--minutes` runs `--concurrency` clients sending a random
mix of streamed and non-streamed chat and completions requests, some of which hang up mid-stream, while

- every `--fault-every` seconds one engine (never two at once, so a healthy one is always left) gets a
  fault for `--fault-for` seconds: UNAVAILABLE or RESOURCE_EXHAUSTED on every call, streams cut after a
  few tokens, a stall (answered by extproc's first-token deadline), or slow steps;
- once, at `--restart-at` of the run, the extproc child of `up` is killed with SIGKILL (the supervisor
  restarts it; Envoy answers 503 meanwhile).

It reports sent / completed / errored (by the kind the client saw) / disconnected / lost (neither an
answer nor an error: must be 0, see load.soak_outcomes) and the resident memory of Envoy and extproc
sampled after warm-up (`--warmup` seconds after the restart) and at the end. Exit status 1 when a request
was lost or memory grew past the stated bound.

    python -m load.soak --minutes 3 --concurrency 16 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from load.bench.procs import free_port
from load.soak_client import plan_request, send
from load.soak_outcomes import Tally

MODEL = "llama3-default"
REPO = Path(__file__).resolve().parent.parent
# Memory may grow this much between the warm-up sample and the end (the larger of the two) before the run
# fails: allocator arenas and caches settle within it; a leak of a few KB per request over thousands of
# requests does not.
RSS_BOUND_MB = 32.0
RSS_BOUND_FRACTION = 0.10
# A fault explains failures of requests sent this long before it began or after it ended (open streams
# it cut; the first-token deadline running out).
EXPLAIN_MARGIN_S = 5.0
FAULTS: tuple[dict[str, object], ...] = (
    {"fail_code": "UNAVAILABLE", "fail_message": "soak: engine refusing"},
    {"fail_code": "RESOURCE_EXHAUSTED", "fail_message": "soak: engine full"},
    {"die_after_tokens": 3},
    {"stall": True},
    {"slow": 4.0},
)


def free_block(n: int) -> int:
    """The first of n consecutive free ports."""
    for _ in range(200):
        first = free_port()
        if first + n < 65535 and all(_is_free(first + i) for i in range(n)):
            return first
    raise RuntimeError(f"no {n} consecutive free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for {pid}")


def child_of(parent: int, marker: str) -> int | None:
    """The live direct child of `parent` whose command line contains `marker`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(stat[1]) == parent and stat[0] != "Z" and marker in cmdline:
            return int(entry)
    return None


@dataclass
class Stack:
    """The processes under test and where they listen."""

    port: int
    sim: subprocess.Popen[bytes]
    up: subprocess.Popen[bytes]
    metrics_ports: list[int]
    log_dir: Path

    def extproc_pid(self) -> int | None:
        return child_of(self.up.pid, "extproc serve")

    def envoy_pid(self) -> int | None:
        return child_of(self.up.pid, "envoy")


def _wait_serving(port: int, up: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"extproc up exited with {up.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if r.status == 200 and "extproc: serving" in log.read_text():
                    return
        time.sleep(0.25)
    raise RuntimeError(f"the stack did not serve within {timeout_s:g}s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running_stack(engines: int, log_dir: Path, first_token_timeout: float) -> Iterator[Stack]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTPROC_")}
    env["EXTPROC_CACHE_DIR"] = str(log_dir / "cache")
    sim_port, metrics_port = free_block(engines), free_block(engines)
    sim_argv = [sys.executable, "-m", "extproc.simulator", "--port", str(sim_port), "--engines", str(engines)]
    sim_argv += ["--model-name", MODEL, "--metrics-port", str(metrics_port)]
    port = free_port()
    up_argv = [sys.executable, "-m", "extproc", "up", "--port", str(port), "--admin-port", str(free_port())]
    up_argv += ["--listen", f"127.0.0.1:{free_port()}", "--liveness-interval", "2"]
    up_argv += ["--first-token-timeout", str(first_token_timeout), "--inter-token-timeout", "10"]
    up_argv += ["--engine", ",".join(f"grpc://127.0.0.1:{sim_port + i}" for i in range(engines))]
    sim_log, up_log = log_dir / "sim.log", log_dir / "up.log"
    with open(sim_log, "wb") as out:
        sim = subprocess.Popen(sim_argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    up: subprocess.Popen[bytes] | None = None
    try:
        with open(up_log, "wb") as out:
            up = subprocess.Popen(up_argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _wait_serving(port, up, up_log, 180)
        yield Stack(port, sim, up, [metrics_port + i for i in range(engines)], log_dir)
    finally:
        for proc in (up, sim):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def set_fault(metrics_port: int, fault: dict[str, object] | None) -> None:
    """POST the fault to an engine's control port, or DELETE its faults."""
    url = f"http://127.0.0.1:{metrics_port}/faults"
    if fault is None:
        request = urllib.request.Request(url, method="DELETE")
    else:
        data = json.dumps(fault).encode()
        request = urllib.request.Request(url, data, {"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        response.read()


@dataclass
class Run:
    """What happened during the run, for the report."""

    tally: Tally = field(default_factory=Tally)
    lock: threading.Lock = field(default_factory=threading.Lock)
    faults: list[str] = field(default_factory=list)
    # When each fault and the restart were in force (seconds into the run), to tell which errors they
    # explain: (start, end).
    fault_windows: list[tuple[float, float]] = field(default_factory=list)
    restart_window: tuple[float, float] | None = None
    # (seconds into the run, error kind) of every request that did not complete.
    failures: list[tuple[float, str]] = field(default_factory=list)
    restart: str = ""
    # (seconds into the run, Envoy MB, extproc MB, extproc pid)
    rss: list[tuple[float, float, float, int]] = field(default_factory=list)
    warm_at: float = 0.0
    start: float = 0.0  # time.monotonic() when the load began


def client(stack: Stack, run: Run, seed: int, stop: threading.Event, disconnect_share: float) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        plan = plan_request(rng, MODEL, disconnect_share)
        with run.lock:
            run.tally.sent += 1
        sent_at = time.monotonic() - run.start
        outcome = send("127.0.0.1", stack.port, plan, timeout_s=60)
        with run.lock:
            run.tally.add(outcome)
            if outcome.kind in ("errored", "lost"):
                run.failures.append((sent_at, f"{outcome.kind}: {outcome.detail}"))
        if outcome.kind != "completed":
            stop.wait(0.05)  # a failing stack is not hammered in a tight loop


def inject_faults(
    stack: Stack, run: Run, rng: random.Random, every_s: float, for_s: float, stop: threading.Event
) -> None:
    """Each kind of fault in turn (in a seeded order), each on a random engine."""
    order = list(FAULTS)
    rng.shuffle(order)
    turn = 0
    while not stop.wait(every_s):
        engine = rng.randrange(len(stack.metrics_ports))
        fault = order[turn % len(order)]
        turn += 1
        began = time.monotonic() - run.start
        run.faults.append(f"{began:.0f}s engine {engine}: {json.dumps(fault)}")
        set_fault(stack.metrics_ports[engine], fault)
        stop.wait(for_s)
        set_fault(stack.metrics_ports[engine], None)
        run.fault_windows.append((began, time.monotonic() - run.start))


def restart_extproc(stack: Stack, run: Run, at_s: float, stop: threading.Event) -> None:
    if stop.wait(at_s):
        return
    victim = stack.extproc_pid()
    if victim is None:
        run.restart = "no extproc child to kill"
        return
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    while not stop.is_set():
        pid = stack.extproc_pid()
        if pid is not None and pid != victim and "server is back" in (stack.log_dir / "up.log").read_text():
            back_s = time.monotonic() - killed
            run.restart = f"extproc (pid {victim}) SIGKILLed at {killed - run.start:.0f}s, "
            run.restart += f"back as pid {pid} after {back_s:.1f}s"
            run.restart_window = (killed - run.start, killed - run.start + back_s)
            return
        time.sleep(0.2)


def explain_failures(run: Run, margin_s: float) -> dict[str, dict[str, int]]:
    """Each failure by what was going on when its request was sent: the extproc restart, an engine
    fault (each window widened by `margin_s` either side: requests already open, deadlines running out),
    or neither (a failure nothing injected explains)."""
    explained: dict[str, dict[str, int]] = {"restart": {}, "engine fault": {}, "neither": {}}

    def within(at: float, window: tuple[float, float]) -> bool:
        return window[0] - margin_s <= at <= window[1] + margin_s

    for at, kind in run.failures:
        if run.restart_window is not None and within(at, run.restart_window):
            cause = "restart"
        elif any(within(at, w) for w in run.fault_windows):
            cause = "engine fault"
        else:
            cause = "neither"
        explained[cause][kind] = explained[cause].get(kind, 0) + 1
    return explained


def sample_rss(stack: Stack, run: Run, every_s: float, stop: threading.Event) -> None:
    while True:
        envoy, extproc = stack.envoy_pid(), stack.extproc_pid()
        if envoy is not None and extproc is not None:
            with contextlib.suppress(OSError, ValueError):
                run.rss.append((time.monotonic() - run.start, rss_mb(envoy), rss_mb(extproc), extproc))
        if stop.wait(every_s):
            return


def rss_report(run: Run) -> tuple[dict[str, object], bool]:
    """Warm-up and end samples of the extproc process that ran to the end, and Envoy's; within bound?"""
    if not run.rss:
        return {"error": "no samples"}, False
    last = run.rss[-1]
    same_process = [s for s in run.rss if s[3] == last[3]]
    warm = next((s for s in same_process if s[0] >= run.warm_at), same_process[0])
    report: dict[str, object] = {"warm_sample_s": round(warm[0]), "end_sample_s": round(last[0])}
    within = True
    for name, index in (("envoy", 1), ("extproc", 2)):
        growth = last[index] - warm[index]
        bound = max(RSS_BOUND_MB, warm[index] * RSS_BOUND_FRACTION)
        within = within and growth <= bound
        peak = max(s[index] for s in same_process if s[0] >= warm[0])
        report[name] = {
            "warm_mb": round(warm[index], 1),
            "end_mb": round(last[index], 1),
            "peak_mb": round(peak, 1),
            "growth_mb": round(growth, 1),
            "growth_pct": round(100 * growth / warm[index], 1),
            "bound_mb": round(bound, 1),
        }
    return report, within


def soak(args: argparse.Namespace) -> int:
    duration = args.minutes * 60
    rng = random.Random(args.seed)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="extproc-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    run = Run()
    with running_stack(args.engines, log_dir, args.first_token_timeout) as stack:
        start = run.start = time.monotonic()
        restart_s = duration * args.restart_at
        run.warm_at = restart_s + args.warmup
        stop, stop_faults = threading.Event(), threading.Event()
        threads = [
            threading.Thread(target=client, args=(stack, run, args.seed * 1000 + i, stop, args.disconnects))
            for i in range(args.concurrency)
        ]
        threads.append(
            threading.Thread(
                target=inject_faults,
                args=(stack, run, rng, args.fault_every, args.fault_for, stop_faults),
            )
        )
        threads.append(threading.Thread(target=restart_extproc, args=(stack, run, restart_s, stop_faults)))
        sampler = threading.Thread(target=sample_rss, args=(stack, run, 5.0, stop))
        for thread in [*threads, sampler]:
            thread.start()
        time.sleep(duration)
        # Faults stop first, then the clients finish what they have open (each at most its timeout).
        stop_faults.set()
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
        sampler.join(timeout=10)
        elapsed = time.monotonic() - start
        with contextlib.suppress(OSError):
            for port in stack.metrics_ports:
                set_fault(port, None)
    rss, rss_ok = rss_report(run)
    summary = run.tally.summary()
    report = {
        "duration_s": round(elapsed),
        "concurrency": args.concurrency,
        "seed": args.seed,
        "engines": args.engines,
        **summary,
        "requests_per_s": round(run.tally.sent / elapsed, 1),
        "failures_by_cause": explain_failures(run, EXPLAIN_MARGIN_S),
        "restart": run.restart,
        "faults": run.faults,
        "rss": rss,
        "rss_within_bound": rss_ok,
        "logs": str(log_dir),
    }
    print(json.dumps(report, indent=2))
    ok = run.tally.lost == 0 and rss_ok and run.restart.startswith("extproc (pid")
    print(
        "soak: " + ("passed" if ok else "FAILED (lost requests, memory growth or no restart)"),
        file=sys.stderr,
    )
    return 0 if ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m load.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16, help="clients, each one request at a time")
    parser.add_argument("--seed", type=int, default=1, help="the request mix and the fault schedule")
    parser.add_argument("--engines", type=int, default=3, help="simulated engines (at least 2)")
    parser.add_argument("--fault-every", type=float, default=15.0, help="seconds between engine faults")
    parser.add_argument("--fault-for", type=float, default=5.0, help="seconds each fault lasts")
    parser.add_argument(
        "--restart-at", type=float, default=0.25, help="when to kill extproc, a fraction of the run"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds after the restart before the first RSS sample counts",
    )
    parser.add_argument(
        "--disconnects", type=float, default=0.1, help="share of streamed requests that hang up mid-stream"
    )
    parser.add_argument(
        "--first-token-timeout", type=float, default=3.0, help="extproc's deadline (answers a stalled engine)"
    )
    parser.add_argument(
        "--log-dir", default=None, help="where the children's logs go (default: a new temporary folder)"
    )
    args = parser.parse_args(argv)
    if args.engines < 2:
        parser.error("--engines must be at least 2: a faulty engine needs a healthy one beside it")
    return args


def main(argv: list[str] | None = None) -> int:
    return soak(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
