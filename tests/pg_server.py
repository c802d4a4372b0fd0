"""A throwaway PostgreSQL server for tests: `initdb` into a fresh folder, `postgres` on a free loopback port
with its unix socket in that folder, stopped and the folder removed at the end, also when a test fails.

The binaries are Debian's (`apt-get install postgresql`: /usr/lib/postgresql/<version>/bin, the newest
version found) or those in `EXTPROC_PG_BIN`. Missing binaries fail the test: a skip would hide a backend
nobody ran. PostgreSQL refuses to run as root, so as root the server runs as `nobody`, in a folder made
under /tmp (pytest's own temp folders are private to root) and given to `nobody`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from load.bench.procs import free_port

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def pg_binaries() -> Path:
    """The folder with initdb and postgres; raises, with the fix, when there is none."""
    explicit = os.environ.get("EXTPROC_PG_BIN")
    if explicit:
        if not (Path(explicit) / "initdb").exists():
            raise RuntimeError(f"EXTPROC_PG_BIN={explicit} has no initdb")
        return Path(explicit)
    found = []
    for version_dir in Path("/usr/lib/postgresql").glob("*"):
        if version_dir.name.isdigit() and (version_dir / "bin" / "initdb").exists():
            found.append((int(version_dir.name), version_dir / "bin"))
    if not found:
        raise RuntimeError(
            "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): install Debian's `postgresql` "
            "package (`apt-get install -y postgresql`) or set EXTPROC_PG_BIN"
        )
    return max(found)[1]


def _run_as() -> dict[str, Any]:
    """subprocess arguments that drop root to `nobody` (nothing when not root)."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A running server; yields the URL of its `postgres` database (user `postgres`, no password)."""
    bin_dir = pg_binaries()
    drop = _run_as()
    root = Path(tempfile.mkdtemp(prefix="extproc-pg-"))
    proc: subprocess.Popen[bytes] | None = None
    log = root / "server.log"
    try:
        if drop:
            os.chown(root, drop["user"], drop["group"])
        data = root / "data"
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
        initdb += ["-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(initdb, cwd=root, capture_output=True, text=True, check=False, **drop)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        port = free_port()
        argv = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root)]
        # A test server: durability off (fast), loopback only.
        for option in ("listen_addresses=127.0.0.1", "fsync=off", "synchronous_commit=off"):
            argv += ["-c", option]
        argv += ["-c", "full_page_writes=off"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, cwd=root, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **drop
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(bin_dir, port):
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({proc.returncode}):\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not ready within {START_TIMEOUT_S:g}s:\n{log.read_text()}")
            time.sleep(0.05)
        yield f"postgres://postgres@127.0.0.1:{port}/postgres"
    finally:
        if proc is not None and proc.poll() is None:
            # SIGINT is PostgreSQL's fast shutdown: sessions are ended and the server exits at once.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _ready(bin_dir: Path, port: int) -> bool:
    """Accepting connections (not just the port: a starting server answers "starting up")."""
    if not _accepts(port):
        return False
    isready = [str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    return subprocess.run(isready, check=False, capture_output=True).returncode == 0
