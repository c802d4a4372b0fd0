"""`extproc up` survives its children: a killed extproc or simulator is restarted while Envoy answers 503, a
hung extproc is noticed and replaced, and SIGTERM drains (open streams get the shutdown grace, the rest are
cut and aborted at the engine, then everything exits in order). Through the real stack, as a user sees it;
plus the supervisor's restart and stop mechanics with stand-in children."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from extproc.supervisor import ChildSpec, RestartPolicy, Supervisor, tcp_accepts
from tests.integration.test_stack_up import SERVE_PY, alive, descendants, running_up

LIVENESS_S = 1.0
GRACE_S = 4.0
# How long a restarted child may take to serve again (extproc reloads its model and finds its engines).
BACK_WITHIN_S = 90.0
# After the grace: extproc cuts what is left (1 s), waits for the engines' abort answers (up to 2.5 s),
# then Envoy and the simulator stop.
EXIT_AFTER_GRACE_S = 10.0
MODEL = "llama3-default"


# --- helpers ------------------------------------------------------------------------------------------------


def child_pid(up: Any, marker: str) -> int:
    """The pid of `up`'s direct child whose command line contains `marker`."""
    for pid in descendants(up.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if parent == up.pid and marker in cmdline:
            return pid
    raise AssertionError(f"no child of extproc up runs {marker!r}")


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@dataclass
class ClientLoop:
    """Short chat requests one after another, each outcome recorded with the time its request started:
    an HTTP status, or 'refused' / 'timeout' / another error's name (what a client must never see here).
    A request already open when a process is killed may fail otherwise; those started after are counted."""

    port: int
    outcomes: list[tuple[float, int | str]] = field(default_factory=list)
    bodies_503: list[Any] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        while not self.stop.is_set():
            request = urllib.request.Request(
                url, data=body.encode(), headers={"content-type": "application/json"}
            )
            outcome: int | str
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    resp.read()
                    outcome = resp.status
            except urllib.error.HTTPError as e:
                outcome = e.code
                payload = e.read()
                if e.code == 503:
                    self.bodies_503.append((e.headers.get("content-type"), json.loads(payload)))
            except ConnectionRefusedError:
                outcome = "refused"
            except TimeoutError:
                outcome = "timeout"
            except OSError as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, ConnectionRefusedError):
                    outcome = "refused"
                elif isinstance(reason, TimeoutError):
                    outcome = "timeout"
                else:
                    outcome = type(reason).__name__
            self.outcomes.append((started, outcome))
            self.stop.wait(0.02)

    def since(self, t: float) -> list[int | str]:
        return [o for at, o in self.outcomes if at >= t]

    def wait_for(self, after: float, want: int | str, timeout_s: float) -> float:
        """When the first `want` after `after` came (fails after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = [at for at, o in list(self.outcomes) if at >= after and o == want]
            if hits:
                return hits[0]
            time.sleep(0.05)
        raise AssertionError(
            f"no {want} within {timeout_s}s; outcomes since: {sorted(set(self.since(after)))}"
        )


@pytest.fixture
def client_loop() -> Iterator[Any]:
    loops: list[tuple[ClientLoop, threading.Thread]] = []

    def start(port: int) -> ClientLoop:
        loop = ClientLoop(port)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        loops.append((loop, thread))
        return loop

    yield start
    for loop, thread in loops:
        loop.stop.set()
        thread.join(timeout=15)


def log_lines(log: Path, pattern: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if re.search(pattern, line)]


# --- restarts through the real stack ------------------------------------------------------------------------


@pytest.mark.parametrize("marker,name", [("extproc serve", "server"), ("extproc.simulator", "sim")])
def test_a_killed_child_is_restarted_while_envoy_answers_503(
    tmp_path: Path, free_ports: Any, client_loop: Any, marker: str, name: str
) -> None:
    with running_up(tmp_path, free_ports, "--liveness-interval", str(LIVENESS_S)) as (up, port, log):
        loop = client_loop(port)
        loop.wait_for(0, 200, 30)
        victim = child_pid(up, marker)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()

        first_503 = loop.wait_for(killed_at, 503, 30)
        back = loop.wait_for(first_503, 200, BACK_WITHIN_S)
        # "Back" for good: the first 200 after the supervisor reports the child ready (a 200 before it can
        # come from an engine extproc has not yet seen fail).
        deadline = time.monotonic() + BACK_WITHIN_S
        while not log_lines(log, rf"^extproc: {name} is back") and time.monotonic() < deadline:
            time.sleep(0.1)
        ready = loop.wait_for(time.monotonic(), 200, BACK_WITHIN_S)
        time.sleep(1.0)  # and it stays back
        loop.stop.set()

        assert up.poll() is None, f"the stack stopped:\n{log.read_text()}"
        seen = loop.since(killed_at)
        # During the gap clients get 503s: never a refused connection, a hang or a 500.
        assert set(seen) <= {200, 503}, seen
        assert all(o == 200 for o in loop.since(ready)), (loop.since(ready), loop.bodies_503[-1:])
        for content_type, body in loop.bodies_503:
            assert content_type == "application/json"
            assert body["error"]["code"] == 503, body
        assert child_pid(up, marker) != victim
        assert log_lines(log, rf"^extproc: {name} was killed by SIGKILL; restarting it in 0\.5s \(restart 1;")
        assert log_lines(log, rf"^extproc: {name} is back \(restart 1, pid \d+\)")
        print(f"{name}: 503s for {back - first_503:.1f}s, back {back - killed_at:.1f}s after the kill")


def test_a_hung_extproc_is_noticed_and_replaced(tmp_path: Path, free_ports: Any, client_loop: Any) -> None:
    with running_up(tmp_path, free_ports, "--liveness-interval", str(LIVENESS_S)) as (up, port, log):
        loop = client_loop(port)
        loop.wait_for(0, 200, 30)
        hung = child_pid(up, "extproc serve")
        hung_started = start_time(hung)
        pidfd = os.pidfd_open(hung)  # names this process, not whoever gets its pid later
        try:
            stopped_at = time.monotonic()
            os.kill(hung, signal.SIGSTOP)
            # Noticed within (failures + 1) probe intervals, plus scheduling slack on a busy machine.
            bound = 4 * LIVENESS_S + 2.0
            deadline = stopped_at + bound + 10
            while alive({hung: hung_started}) and time.monotonic() < deadline:
                time.sleep(0.05)
            gone_after = time.monotonic() - stopped_at
            assert gone_after <= bound, f"hung extproc killed after {gone_after:.1f}s:\n{log.read_text()}"
            back = loop.wait_for(stopped_at + gone_after, 200, BACK_WITHIN_S)
            # The old process is gone for good: resuming it finds nothing.
            with pytest.raises(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGCONT)
        finally:
            os.close(pidfd)
        assert up.poll() is None, log.read_text()
        assert child_pid(up, "extproc serve") != hung
        assert log_lines(
            log, r"^extproc: server \(pid \d+\) did not answer a gRPC call on .* 3 times in a row"
        )
        assert log_lines(
            log, r"^extproc: server was killed by SIGKILL \(after 3 unanswered liveness probes\)"
        )
        print(f"hung extproc killed {gone_after:.1f}s after SIGSTOP, serving {back - stopped_at:.1f}s after")


# --- drain on SIGTERM ---------------------------------------------------------------------------------------


@dataclass
class StreamReader:
    """One streamed chat completion read to its end: what arrived, and how it ended."""

    port: int
    max_tokens: int
    data: bytearray = field(default_factory=bytearray)
    first_data: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    # None: read to a clean end; else the error that ended the read.
    error: str | None = None
    ended_at: float = 0.0
    # After a clean end: the server closed the connection (rather than keeping it for another request).
    closed: bool = False

    def run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        body |= {"max_tokens": self.max_tokens, "ignore_eos": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(
                "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
            )
            response = conn.getresponse()
            self.status = response.status
            while chunk := response.read1(65536):
                self.data += chunk
                self.first_data.set()
            self.ended_at = time.monotonic()
            if conn.sock is None:  # http.client closed it: the response said `connection: close`
                self.closed = True
            else:
                conn.sock.settimeout(5)
                self.closed = conn.sock.recv(1) == b""
        except (OSError, http.client.HTTPException) as e:
            self.error = type(e).__name__
        finally:
            self.ended_at = self.ended_at or time.monotonic()
            self.first_data.set()
            conn.close()

    def events(self) -> list[str]:
        return [e.removeprefix("data: ") for e in self.data.decode(errors="replace").split("\n\n") if e]


# `auto` takes the module path where it is built (the Envoy module's stop file ends its answers).
@pytest.mark.parametrize("response_path", ["ext_proc", "auto"])
def test_sigterm_drains_open_streams_then_stops_in_order(
    tmp_path: Path, free_ports: Any, response_path: str
) -> None:
    flags = ("--shutdown-grace", str(GRACE_S), "--liveness-interval", str(LIVENESS_S))
    flags = (*flags, "--response-path", response_path)
    with running_up(tmp_path, free_ports, *flags) as (up, port, log):
        # The simulator makes a token every 2 ms or slower: ~0.6 s for the short stream, at least 12 s
        # for the long one.
        short, long = StreamReader(port, 300), StreamReader(port, 6000)
        threads = [threading.Thread(target=r.run, daemon=True) for r in (short, long)]
        for thread in threads:
            thread.start()
        assert short.first_data.wait(30) and long.first_data.wait(30)
        term_at = time.monotonic()
        up.send_signal(signal.SIGTERM)

        # Envoy stops taking connections at once.
        refused_after = None
        while time.monotonic() < term_at + 3:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    pass
            except urllib.error.HTTPError:
                pass
            except OSError as e:
                if isinstance(getattr(e, "reason", e), ConnectionRefusedError):
                    refused_after = time.monotonic() - term_at
                    break
            time.sleep(0.05)
        assert refused_after is not None, "Envoy still accepts connections 3 s after SIGTERM"

        code = up.wait(timeout=GRACE_S + EXIT_AFTER_GRACE_S + 10)
        exited_after = time.monotonic() - term_at
        for thread in threads:
            thread.join(timeout=10)
        text = log.read_text()
        assert code == 0, text
        assert exited_after <= GRACE_S + EXIT_AFTER_GRACE_S, f"exited {exited_after:.1f}s after SIGTERM"

        # The short stream finished normally within the grace.
        assert short.status == 200 and short.error is None, (short.error, short.events()[-3:])
        assert short.events()[-1] == "[DONE]"
        assert json.loads(short.events()[-2])["choices"][0]["finish_reason"] == "length"
        # The long one ran until the grace was over, then was cut before its end.
        cut_after = long.ended_at - term_at
        assert long.status == 200
        assert GRACE_S - 0.5 <= cut_after <= GRACE_S + 3, f"long stream ended {cut_after:.1f}s after SIGTERM"
        assert '"finish_reason":"length"' not in long.data.decode()

        # The engine saw one request finish and got extproc's Abort for the other, which stopped there
        # (counted as aborted, or as cancelled when Envoy's reset of the engine call came first).
        stops = log_lines(log, r"^sim \| engine \d+ stopped: ")
        assert counted(stops, "completed") == 1, stops
        if response_path == "ext_proc":
            assert counted(stops, "Abort calls") == 1, stops
        else:
            # The module's cut ends the client stream and Envoy resets the engine call at once; extproc's
            # Abort follows the outcome trailer and may find the call already gone (or the engine stopping).
            assert counted(stops, "Abort calls") <= 1, stops
        assert counted(stops, "aborted") + counted(stops, "cancelled") == 1, stops
        # Stopped in order: extproc (after its grace), then Envoy, then the engines.
        lines = text.splitlines()
        envoy_term = next(i for i, line in enumerate(lines) if "caught ENVOY_SIGTERM" in line)
        assert max(i for i, line in enumerate(lines) if line.startswith("server |")) < envoy_term
        assert min(i for i, line in enumerate(lines) if line in stops) > envoy_term
        print(
            f"refused new connections after {refused_after:.2f}s; long stream cut {cut_after:.1f}s after "
            f"SIGTERM (grace {GRACE_S:g}s); exit 0 after {exited_after:.1f}s"
        )
        # The cut stream ends with an SSE error event (503) and [DONE], then the connection closes.
        events = long.events()
        errors = [json.loads(e)["error"] for e in events[-2:-1] if e.startswith('{"error"')]
        assert errors and errors[0]["code"] == 503, events[-3:]
        assert events[-1] == "[DONE]"
        assert long.error is None and long.closed


def counted(lines: list[str], what: str) -> int:
    """The sum of the numbers before `what` in the lines ("3 aborted")."""
    return sum(int(m[1]) for line in lines if (m := re.search(rf"(\d+) {what}", line)))


# --- the supervisor's mechanics with stand-in children ---------------------------------------------------


def test_restart_delays_double_up_to_the_cap() -> None:
    policy = RestartPolicy(first_delay_s=0.5, max_delay_s=30.0)
    assert [policy.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def _stand_in(name: str, port: int, restart: RestartPolicy | None) -> ChildSpec:
    argv = [sys.executable, "-c", SERVE_PY, str(port)]
    return ChildSpec(name, argv, tcp_accepts("127.0.0.1", port), f"port {port} accepting", restart=restart)


class Said:
    """What the supervisor says, as a stream."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [line for line in text.splitlines() if line.startswith("extproc: ")]

    def flush(self) -> None:
        pass


def test_supervisor_restarts_a_dying_child_with_growing_delays(tmp_path: Path, free_ports: Any) -> None:
    said = Said()
    stop = threading.Event()
    sup = Supervisor(tmp_path, stop, echo=said, startup_timeout_s=20)  # type: ignore[arg-type]
    policy = RestartPolicy(first_delay_s=0.2, max_delay_s=0.4, stable_after_s=60)
    child = sup.start(_stand_in("worker", free_ports.one(), policy), timeout_s=20)
    watcher = threading.Thread(target=sup.watch, kwargs={"poll_s": 0.05}, daemon=True)
    watcher.start()
    try:
        pids = [child.proc.pid]
        for restart in (1, 2, 3):
            os.kill(pids[-1], signal.SIGKILL)
            deadline = time.monotonic() + 20
            while child.restarts < restart and time.monotonic() < deadline:
                time.sleep(0.05)
            assert child.restarts == restart, said.lines
            pids.append(child.proc.pid)
        assert len(set(pids)) == 4
        delays = [
            m[1] for line in said.lines if (m := re.search(r"killed .* restarting it in ([\d.]+)s", line))
        ]
        assert delays == ["0.2", "0.4", "0.4"], said.lines  # doubled, then capped
        assert "extproc: worker is back (restart 3, pid" in said.lines[-1]
    finally:
        stop.set()
        watcher.join(timeout=5)
        sup.stop_all(grace_s=2)


def test_a_child_without_a_policy_ends_the_watch(tmp_path: Path, free_ports: Any) -> None:
    sup = Supervisor(tmp_path, threading.Event(), echo=None)
    try:
        sup.start(_stand_in("keeper", free_ports.one(), RestartPolicy()), timeout_s=20)
        front = sup.start(_stand_in("front", free_ports.one(), None), timeout_s=20)
        os.kill(front.proc.pid, signal.SIGKILL)
        started = time.monotonic()
        assert sup.watch(poll_s=0.05) is front
        assert time.monotonic() - started < 5
    finally:
        sup.stop_all(grace_s=2)


NOTE_SIGTERM_PY = """
import signal, socket, sys, time
def on_term(signum, frame):
    time.sleep(0.2)  # still running: whoever stops next must wait for this one to be gone
    with open(sys.argv[2], "a") as notes:
        notes.write(sys.argv[3] + " exited\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
sock = socket.socket()
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
while True:
    time.sleep(1)
"""


def test_stop_all_drains_first_then_stops_in_the_given_order(tmp_path: Path, free_ports: Any) -> None:
    notes = tmp_path / "notes"
    sup = Supervisor(tmp_path, threading.Event(), echo=None)
    for name in ("engine", "server", "envoy"):
        port = free_ports.one()
        argv = [sys.executable, "-c", NOTE_SIGTERM_PY, str(port), str(notes), name]
        spec = ChildSpec(name, argv, tcp_accepts("127.0.0.1", port), "accepting")
        if name == "envoy":
            spec.drain = lambda: notes.write_text("envoy drained\n")
        sup.start(spec, timeout_s=20)
    sup.stop_all(order=("server", "envoy"))
    assert notes.read_text().splitlines() == [
        "envoy drained",
        "server exited",
        "envoy exited",
        "engine exited",
    ]


def test_an_urgent_stop_does_not_wait_for_the_stop_timeout(tmp_path: Path, free_ports: Any) -> None:
    """A second Ctrl-C during a drain: children still draining are killed at once."""
    urgent = threading.Event()
    sup = Supervisor(tmp_path, threading.Event(), echo=None, urgent=urgent)
    argv = [sys.executable, "-c", SERVE_PY, str(port := free_ports.one()), "ignore-sigterm"]
    spec = ChildSpec("slow", argv, tcp_accepts("127.0.0.1", port), "accepting", stop_timeout_s=60)
    child = sup.start(spec, timeout_s=20)
    threading.Timer(0.5, urgent.set).start()
    started = time.monotonic()
    sup.stop_all()
    assert time.monotonic() - started < 5
    assert child.proc.returncode == -signal.SIGKILL
