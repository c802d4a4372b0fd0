"""The process supervisor of `extproc up`: starts child processes, awaits each until ready, watches them and
stops them all.

A child's output goes, prefixed with its name, to our stderr and to a log file in the run directory.
Children run in their own sessions (so the terminal's Ctrl-C reaches only us and we stop them in order) and
get PR_SET_PDEATHSIG, so none outlives us even when we are SIGKILLed. What the children are is
extproc.stack's business.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

TAIL_LINES = 20
STOP_GRACE_S = 10.0


class StackError(RuntimeError):
    """The stack could not start or keep running; the message names the child and shows its output."""


class Interrupted(Exception):
    """A stop signal arrived while starting."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event that SIGINT and SIGTERM set while the block runs (their handlers restored after)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- readiness probes ---------------------------------------------------------------------------------------


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


@dataclass
class Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None

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


def _pump(child: Child, stream: IO[bytes], log_path: Path, echo: IO[str] | None) -> None:
    prefix = f"{child.name} | "
    with open(log_path, "wb") as log:
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
    """Starts children, waits for them to be ready, notices deaths, stops them all."""

    def __init__(self, run_dir: Path, stop: threading.Event, echo: IO[str] | None = sys.stderr) -> None:
        self.run_dir = run_dir
        self.stop = stop
        self.echo = echo
        self.children: list[Child] = []

    def start(self, spec: ChildSpec, timeout_s: float) -> Child:
        proc = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=spec.env,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        child = Child(spec, proc)
        self.children.append(child)
        assert proc.stdout is not None
        child.reader = threading.Thread(
            target=_pump,
            args=(child, proc.stdout, self.run_dir / f"{spec.name}.log", self.echo),
            name=f"pump-{spec.name}",
            daemon=True,
        )
        child.reader.start()
        self._await_ready(child, timeout_s)
        return child

    def _await_ready(self, child: Child, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.stop.is_set():
                raise Interrupted
            code = child.proc.poll()
            if code is not None:
                self._drain(child)
                raise StackError(
                    f"{child.name} exited with code {code} while starting "
                    f"(log: {self.run_dir / child.name}.log):\n{child.tail_text()}"
                )
            if child.spec.ready():
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{child.name} was not ready after {timeout_s:g}s ({child.spec.ready_desc}) "
                    f"(log: {self.run_dir / child.name}.log):\n{child.tail_text()}"
                )
            self.stop.wait(0.1)

    def _drain(self, child: Child) -> None:
        if child.reader is not None:
            child.reader.join(timeout=2.0)

    def first_dead(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def watch(self, poll_s: float = 0.2) -> Child | None:
        """Wait for the stop event (None) or for a child to die (that child, its output read to the end)."""
        while not self.stop.wait(poll_s):
            dead = self.first_dead()
            if dead is not None:
                self._drain(dead)
                return dead
        return None

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM everyone (newest first: Envoy stops taking requests before its backends go), then
        SIGKILL whoever is still there after the grace period."""
        for child in reversed(self.children):
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.signal_group(signal.SIGKILL)
                child.proc.wait()
            # Take any stragglers of its group down with it.
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for child in self.children:
            self._drain(child)
