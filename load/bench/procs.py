"""Child processes for the benchmark, and the CPU time they spend.

CPU time is read from /proc/<pid>/stat (utime + stime: every thread of the process, exited ones
included) for a process and all its descendants, so a gateway that forks or spawns helpers is counted
whole. The kernel counts in clock ticks (usually 10 ms); a phase spends seconds, so that is noise of a
percent or less.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STOP_GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            raw = file.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(roots: Iterable[int]) -> set[int]:
    """The roots and every process below them, alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid for pid in roots if os.path.exists(f"/proc/{pid}")]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(roots: Iterable[int]) -> float:
    """user + system CPU seconds spent so far by the roots and their descendants."""
    total = 0
    for pid in descendants(roots):
        fields = _stat_fields(pid)
        if fields:
            # Fields 14 and 15 of stat (utime, stime); this list starts at field 3.
            total += int(fields[11]) + int(fields[12])
    return total / TICKS_PER_S


_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_us() -> Callable[[], None] | None:
    """A preexec hook so no child outlives a benchmark that was killed."""
    if _prctl is None or not sys.platform.startswith("linux"):
        return None
    prctl, parent = _prctl, os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    log_name: str | None = None,
) -> Child:
    """Start a child with its output in log_dir/<log_name or name>.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{log_name or name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            # Safe: children are started before this process has other threads.
            preexec_fn=_die_with_us(),
        )
    return Child(name, proc, log)


class StartError(RuntimeError):
    pass


def wait_for(child: Child, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.alive():
            raise StartError(f"{child.name} exited with {child.proc.returncode}:\n{child.log_tail()}")
        if ready():
            return
        time.sleep(0.1)
    raise StartError(f"{child.name}: no {what} after {timeout_s:.0f} s:\n{child.log_tail()}")
