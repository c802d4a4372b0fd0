"""The process supervisor of `extproc up`: starts child processes, awaits each until ready, keeps them
running (restarts with backoff, liveness probes) and stops them all, draining first.

A child's output goes, prefixed with its name, to our stderr and to a log file in the run directory.
Children run in their own sessions (so the terminal's Ctrl-C reaches only us and we stop them in order) and
get PR_SET_PDEATHSIG, so none outlives us even when we are SIGKILLed. What the children are, which of them
restart and in which order they stop is extproc.stack's business.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import enum
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from extproc.grpc_tls import ClientTls

TAIL_LINES = 20
STOP_GRACE_S = 10.0
WATCH_POLL_S = 0.1


class StackError(RuntimeError):
    """The stack could not start or keep running; the message names the child and shows its output."""


class Interrupted(Exception):
    """A stop signal arrived while starting."""


@dataclass
class StopRequest:
    """Set by the first SIGINT/SIGTERM (`requested`: drain and stop) and by a second one (`urgent`: stop
    waiting for anything, kill what is left)."""

    requested: threading.Event = field(default_factory=threading.Event)
    urgent: threading.Event = field(default_factory=threading.Event)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """A StopRequest that SIGINT and SIGTERM set while the block runs (their handlers restored after)."""
    stop = StopRequest()

    def on_signal(signum: int, frame: object) -> None:
        if stop.requested.is_set():
            stop.urgent.set()
        stop.requested.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- probes -------------------------------------------------------------------------------------------------


def connect_host(host: str) -> str:
    """Where to connect to reach a server bound to `host` (wildcards mean loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def tcp_accepts(host: str, port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.create_connection((connect_host(host), port), timeout=0.5):
                return True
        except OSError:
            return False

    return probe


def unix_accepts(path: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(path)
                return True
        except OSError:
            return False

    return probe


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return resp.status == 200
        except OSError:
            return False

    return probe


GRPC_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def grpc_answers(target: str, tls: ClientTls | None = None) -> Callable[[float], bool]:
    """A liveness probe of the gRPC server at `target` (a gRPC target: "host:port", "unix:/path"): a
    grpc.health.v1 Check that must be answered within the deadline. Any answer counts, UNIMPLEMENTED
    included: it proves the server's request loop is running, which a TCP connect (answered by the
    kernel, even for a stopped process) does not."""
    import grpc  # only `up` needs it, once it runs

    alive_codes = (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED)

    def open_channel() -> grpc.Channel:
        if tls is None:
            return grpc.insecure_channel(target)
        return grpc.secure_channel(target, tls.credentials(), options=tls.options())

    def probe(deadline_s: float) -> bool:
        with open_channel() as channel:
            # The empty HealthCheckRequest (all service) is zero bytes; the answer is not read.
            check = channel.unary_unary(GRPC_HEALTH_CHECK)
            try:
                check(b"", timeout=deadline_s)
                return True
            except grpc.RpcError as exc:
                return exc.code() in alive_codes  # type: ignore[attr-defined]

    return probe


# --- policies -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartPolicy:
    """A child that dies (or is killed for failing its liveness probes) starts again after a delay that
    doubles with each consecutive failure, up to a cap; once it has been up for `stable_after_s`, the next
    failure starts from the first delay again."""

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_after_s: float = 30.0

    def delay(self, consecutive_failures: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** max(consecutive_failures - 1, 0))


@dataclass(frozen=True)
class Liveness:
    """A child that stops answering `probe` (called with its deadline, `interval_s`) `failures` times in
    a row is killed, and restarted by its policy: a hung one is noticed within (failures + 1) intervals."""

    probe: Callable[[float], bool]
    interval_s: float
    # What the probe asks, for the log.
    desc: str
    failures: int = 3


# --- children -----------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
try:
    # Resolved here, in the parent: the child between fork and exec must not load libraries.
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    if _prctl is None or not sys.platform.startswith("linux"):
        return None
    prctl = _prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass
class ChildSpec:
    name: str
    argv: list[str]
    ready: Callable[[], bool]
    # What "ready" means, for error messages.
    ready_desc: str
    env: dict[str, str] | None = None
    # None: its death stops the stack.
    restart: RestartPolicy | None = None
    liveness: Liveness | None = None
    # How long it may take to exit after SIGTERM before it is killed.
    stop_timeout_s: float = STOP_GRACE_S
    # Called before any child is signalled when the stack stops (e.g. Envoy stops taking connections).
    drain: Callable[[], None] | None = None


class State(enum.Enum):
    RUNNING = "running"  # ready (or, before its first start returns, starting)
    WAITING = "waiting"  # dead, restarting after a delay
    RESTARTING = "restarting"  # started again, not ready yet


@dataclass
class Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    state: State = State.RUNNING
    ready_at: float = 0.0
    # Restarts that got it ready again, over the stack's life.
    restarts: int = 0
    # Deaths (or failed restarts) since it was last up for RestartPolicy.stable_after_s.
    failures: int = 0
    # When WAITING: when to start it; when RESTARTING: when to give up on its readiness.
    due: float = 0.0
    # Why it was killed, when we killed it.
    killed_for: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def tail_text(self) -> str:
        lines = list(self.tail)
        if not lines:
            return "  (no output)"
        return "\n".join(f"  {line}" for line in lines)

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the child leads its own session: reach its children too
        except ProcessLookupError:
            pass


def exit_text(code: int) -> str:
    """'exited with code 3' or 'was killed by SIGKILL'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _pump(child: Child, stream: IO[bytes], log_path: Path, echo: IO[str] | None, append: bool) -> None:
    prefix = f"{child.name} | "
    with open(log_path, "ab" if append else "wb") as log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace").rstrip()
            child.tail.append(line)
            if echo is not None:
                try:
                    echo.write(prefix + line + "\n")
                    echo.flush()
                except (OSError, ValueError):
                    echo = None
    stream.close()


class Supervisor:
    """Starts children, waits for them to be ready, restarts those with a policy, stops them all."""

    def __init__(
        self,
        run_dir: Path,
        stop: threading.Event,
        echo: IO[str] | None = sys.stderr,
        urgent: threading.Event | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.run_dir = run_dir
        self.stop = stop
        self.urgent = urgent or threading.Event()
        self.echo = echo
        # How long a restarted child may take to be ready again.
        self.startup_timeout_s = startup_timeout_s
        self.children: list[Child] = []
        # Held while a child's process is replaced or killed (the watch loop and liveness threads).
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        if self.echo is None:
            return
        try:
            self.echo.write(f"extproc: {text}\n")
            self.echo.flush()
        except (OSError, ValueError):
            pass

    def log_path(self, child: Child | ChildSpec) -> Path:
        return self.run_dir / f"{child.name}.log"

    def _spawn(self, spec: ChildSpec, child: Child | None = None) -> Child:
        proc = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=spec.env,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        restarting = child is not None
        if child is None:
            child = Child(spec, proc)
        else:
            child.proc = proc
        assert proc.stdout is not None
        child.reader = threading.Thread(
            target=_pump,
            args=(child, proc.stdout, self.log_path(spec), self.echo, restarting),
            name=f"pump-{spec.name}",
            daemon=True,
        )
        child.reader.start()
        return child

    def start(self, spec: ChildSpec, timeout_s: float) -> Child:
        child = self._spawn(spec)
        self.children.append(child)
        self._await_ready(child, timeout_s)
        child.ready_at = time.monotonic()
        if spec.liveness is not None:
            args = (child, spec.liveness)
            probing = threading.Thread(target=self._probe_liveness, args=args, name=f"live-{spec.name}")
            probing.daemon = True
            probing.start()
        return child

    def _await_ready(self, child: Child, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.stop.is_set():
                raise Interrupted
            code = child.proc.poll()
            if code is not None:
                self._drain_output(child)
                raise StackError(
                    f"{child.name} exited with code {code} while starting "
                    f"(log: {self.log_path(child)}):\n{child.tail_text()}"
                )
            if child.spec.ready():
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{child.name} was not ready after {timeout_s:g}s ({child.spec.ready_desc}) "
                    f"(log: {self.log_path(child)}):\n{child.tail_text()}"
                )
            self.stop.wait(0.1)

    def _drain_output(self, child: Child) -> None:
        if child.reader is not None:
            child.reader.join(timeout=2.0)

    def first_dead(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    # --- keeping children running ---------------------------------------------------------------------

    def watch(self, poll_s: float = WATCH_POLL_S) -> Child | None:
        """Keep the children running until the stop event (None) or until a child without a restart
        policy dies (that child, its output read to the end)."""
        while not self.stop.wait(poll_s):
            for child in self.children:
                if self._tend(child):
                    return child
        return None

    def _tend(self, child: Child) -> bool:
        """One look at a child: restart steps for one with a policy; True when one without has died."""
        policy = child.spec.restart
        now = time.monotonic()
        if child.state is State.RUNNING:
            code = child.proc.poll()
            if code is None:
                if child.failures and policy is not None and now - child.ready_at >= policy.stable_after_s:
                    child.failures = 0
                return False
            self._drain_output(child)
            if policy is None:
                return True
            why = f" ({child.killed_for})" if child.killed_for else ""
            self._failed(child, policy, f"{child.name} {exit_text(code)}{why}")
        elif child.state is State.WAITING:
            if now >= child.due:
                with self._lock:
                    self._spawn(child.spec, child)
                    child.state, child.due = State.RESTARTING, now + self.startup_timeout_s
                    child.killed_for = None
        elif child.state is State.RESTARTING:
            assert policy is not None
            code = child.proc.poll()
            if code is not None:
                self._drain_output(child)
                self._failed(child, policy, f"{child.name} {exit_text(code)} while restarting")
            elif child.spec.ready():
                child.restarts += 1
                child.state, child.ready_at = State.RUNNING, time.monotonic()
                self.say(f"{child.name} is back (restart {child.restarts}, pid {child.proc.pid})")
            elif now > child.due:
                with self._lock:
                    child.signal_group(signal.SIGKILL)
                child.proc.wait()
                self._drain_output(child)
                desc = child.spec.ready_desc
                message = f"{child.name} was not ready {self.startup_timeout_s:g}s after a restart ({desc})"
                self._failed(child, policy, message)
        return False

    def _failed(self, child: Child, policy: RestartPolicy, what: str) -> None:
        child.failures += 1
        delay = policy.delay(child.failures)
        child.state, child.due = State.WAITING, time.monotonic() + delay
        self.say(
            f"{what}; restarting it in {delay:g}s (restart {child.restarts + 1}; failure {child.failures} "
            f"in a row) (log: {self.log_path(child)})"
        )

    def _probe_liveness(self, child: Child, liveness: Liveness) -> None:
        failed = 0
        due = time.monotonic() + liveness.interval_s
        # One probe per interval, a hung one included (it takes the whole interval).
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + liveness.interval_s
            proc = child.proc
            if child.state is not State.RUNNING or proc.poll() is not None:
                failed = 0
                continue
            try:
                answered = liveness.probe(liveness.interval_s)
            except Exception:  # a probe that breaks counts as unanswered; the thread must go on
                answered = False
            if answered:
                failed = 0
                continue
            failed += 1
            if failed < liveness.failures:
                continue
            failed = 0
            with self._lock:
                if self.stop.is_set() or child.proc is not proc or proc.poll() is not None:
                    continue
                child.killed_for = f"after {liveness.failures} unanswered liveness probes"
                self.say(
                    f"{child.name} (pid {proc.pid}) did not answer {liveness.desc} within "
                    f"{liveness.interval_s:g}s, {liveness.failures} times in a row: killing it"
                )
                child.signal_group(signal.SIGKILL)

    # --- stopping -------------------------------------------------------------------------------------

    def stop_all(self, grace_s: float | None = None, order: Sequence[str] = ()) -> None:
        """Drain, then stop the children one by one: those named in `order` first, in that order, then the
        others newest first. Each gets SIGTERM, then SIGKILL after its stop timeout (`grace_s` when
        given), or at once once the stop turns urgent."""
        self.stop.set()  # liveness probes and restarts end here
        for child in reversed(self.children):
            if child.spec.drain is not None and child.proc.poll() is None:
                try:
                    child.spec.drain()
                except Exception as exc:  # draining is a courtesy; stopping must go on
                    self.say(f"draining {child.name} failed: {exc}")
        named = {c.name: c for c in self.children}
        first = [named[name] for name in order if name in named]
        ordered = first + [c for c in reversed(self.children) if c not in first]
        for child in ordered:
            self._stop_one(child, child.spec.stop_timeout_s if grace_s is None else grace_s)
        for child in self.children:
            self._drain_output(child)

    def _stop_one(self, child: Child, timeout_s: float) -> None:
        with self._lock:
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while child.proc.poll() is None and time.monotonic() < deadline and not self.urgent.is_set():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0.1)
        if child.proc.poll() is None:
            child.signal_group(signal.SIGKILL)
            child.proc.wait()
        # Take any stragglers of its group down with it.
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
