"""Processes a test session started and left running.

The session puts a token in its own environment before any test runs; every process it starts, and every
process those start, inherits it (the tests' subprocesses copy `os.environ`). At the end, any live process
whose environment carries the token is the session's leftover, found through /proc even when its parent
died and it was reparented (no process-tree walk would still see it then). Linux only: elsewhere nothing
is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

# Not EXTPROC_*: that prefix is the settings layer's, and `extproc` children would reject the variable.
MARKER = "PYTEST_EXTPROC_SESSION"
PROC = Path("/proc")


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def mark_session() -> str:
    """Mark this process's future children with a token unique to this session; returns the token."""
    token = f"{os.getpid()}-{time.time_ns()}"
    os.environ[MARKER] = token
    return token


def _is_marked(pid_dir: Path, entry: bytes) -> bool:
    with contextlib.suppress(OSError):
        return entry in (pid_dir / "environ").read_bytes().split(b"\0")
    return False


def _is_alive(pid_dir: Path) -> bool:
    """Running, sleeping or stopped; not a zombie (it has exited, only its exit status is left)."""
    with contextlib.suppress(OSError):
        stat = (pid_dir / "stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    return False


def _command(pid_dir: Path) -> str:
    with contextlib.suppress(OSError):
        return (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    return "?"


def marked_processes(token: str) -> list[Leftover]:
    """Live processes (other than this one) whose environment carries the session's token."""
    entry = f"{MARKER}={token}".encode()
    found = []
    for pid_dir in PROC.glob("[0-9]*"):
        pid = int(pid_dir.name)
        if pid != os.getpid() and _is_marked(pid_dir, entry) and _is_alive(pid_dir):
            found.append(Leftover(pid, _command(pid_dir)))
    return sorted(found, key=lambda p: p.pid)


def leftovers(token: str, grace_s: float = 5.0) -> list[Leftover]:
    """The session's processes still alive after `grace_s` (time for ones being stopped to exit)."""
    deadline = time.monotonic() + grace_s
    while (found := marked_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def kill(found: list[Leftover]) -> None:
    """SIGKILL each leftover (they carry this session's token: they are ours)."""
    for process in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
