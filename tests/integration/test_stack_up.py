"""`extproc up`: the real stack (simulator, extproc, Envoy) comes up, serves, and leaves nothing behind when
stopped; plus the supervisor's failure paths with stand-in children."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc import cli
from extproc.supervisor import ChildSpec, StackError, Supervisor, tcp_accepts

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180  # first start materializes the default model and loads the tokenizer twice
STOP_TIMEOUT_S = 20


# --- /proc helpers -----------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> starttime of every live descendant of root."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[0] != "Z":
                children.setdefault(stat[1], []).append(int(entry))
                starts[int(entry)] = stat[2]
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def alive(processes: dict[int, int]) -> list[int]:
    """Those still running (zombies count as gone: a container's init may never reap them)."""
    live = []
    for pid, start in processes.items():
        stat = _stat(pid)
        if stat and stat[0] != "Z" and stat[2] == start:
            live.append(pid)
    return live


def wait_gone(processes: dict[int, int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --- the real stack ----------------------------------------------------------------------------------------


def _get_json(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, json.loads(resp.read())


@pytest.fixture
def up_stack(tmp_path: Path, free_ports: Any) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    with running_up(tmp_path, free_ports) as running:
        yield running


@contextlib.contextmanager
def running_up(
    tmp_path: Path, free_ports: Any, *extra: str, sim: int = 2
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`extproc up` with `sim` simulated engines of its own (0: the engines `extra` names) and `extra`
    flags, serving; killed at the end if still running. Yields the process, the client port and its log."""
    port = free_ports.one()
    argv = [sys.executable, "-m", "extproc", "up", "--port", str(port)]
    argv += ["--admin-port", str(free_ports.one()), "--listen", f"127.0.0.1:{free_ports.one()}"]
    argv += ["--startup-timeout", str(START_TIMEOUT_S)]
    if sim:
        argv += ["--sim", str(sim), "--sim-port", str(free_ports.block(sim))]
    if "--metrics-port" not in extra:  # not the default 9464: another stack may hold it
        argv += ["--metrics-port", str(free_ports.one())]
    argv += extra
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTPROC_")}
    env["EXTPROC_CACHE_DIR"] = str(tmp_path / "cache")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # up's SQLite store: not in the user's home
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S * 3
        while True:
            assert proc.poll() is None, f"extproc up exited with {proc.returncode}:\n{log.read_text()}"
            try:
                status, body = _get_json(f"http://127.0.0.1:{port}/v1/models")
                # Envoy may answer a moment before the supervisor's own readiness poll sees it and
                # announces the URL; the announcement is what a user waits for, so wait for both.
                if status == 200 and "extproc: serving http://127.0.0.1:" in log.read_text():
                    assert "llama3-default" in [m["id"] for m in body["data"]], body
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"stack not serving:\n{log.read_text()}"
            time.sleep(0.25)
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.kill()  # its children follow (PR_SET_PDEATHSIG)
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_up_serves_then_stops_everything(up_stack: Any, sig: signal.Signals) -> None:
    proc, _, log = up_stack
    family = descendants(proc.pid)
    # Simulator, extproc server and Envoy at least.
    assert len(family) >= 3, family
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"extproc up did not stop within {STOP_TIMEOUT_S}s:\n{log.read_text()}")
    assert code == 0, log.read_text()
    assert wait_gone(family, 5) == [], f"left running after stop:\n{log.read_text()}"


# --- the supervisor with stand-in children -----------------------------------------------------------------

SERVE_PY = textwrap.dedent(
    """
    import signal, socket, sys, time
    ignore_term = len(sys.argv) > 2
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    sock.listen()
    print("listening", flush=True)
    while True:
        time.sleep(1)
    """
)


def _serving_child(name: str, port: int, *extra: str) -> ChildSpec:
    argv = [sys.executable, "-c", SERVE_PY, str(port), *extra]
    return ChildSpec(name, argv, tcp_accepts("127.0.0.1", port), f"port {port} accepting")


def test_supervisor_starts_and_stops_children(tmp_path: Path, free_ports: Any) -> None:
    sup = Supervisor(tmp_path, threading.Event(), echo=None)
    try:
        one = sup.start(_serving_child("one", free_ports.one()), timeout_s=20)
        two = sup.start(_serving_child("two", free_ports.one(), "ignore-sigterm"), timeout_s=20)
        assert sup.first_dead() is None
    finally:
        started = time.monotonic()
        sup.stop_all(grace_s=1.0)
    assert one.proc.returncode == -signal.SIGTERM
    assert two.proc.returncode == -signal.SIGKILL  # ignored SIGTERM: killed after the grace period
    assert time.monotonic() - started < 10
    assert "listening" in (tmp_path / "one.log").read_text()


def test_supervisor_names_a_child_that_dies_while_starting(tmp_path: Path) -> None:
    code = "import sys; print('bad model directory', file=sys.stderr); sys.exit(3)"
    spec = ChildSpec("server", [sys.executable, "-c", code], lambda: False, "never")
    sup = Supervisor(tmp_path, threading.Event(), echo=None)
    with pytest.raises(
        StackError, match=r"(?s)server exited with code 3 while starting.*bad model directory"
    ):
        sup.start(spec, timeout_s=20)
    sup.stop_all()


def test_supervisor_times_out_a_child_that_never_gets_ready(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('warming up', flush=True); time.sleep(60)"]
    spec = ChildSpec("envoy", argv, lambda: False, "GET /ready returning 200")
    sup = Supervisor(tmp_path, threading.Event(), echo=None)
    try:
        with pytest.raises(StackError, match=r"(?s)envoy was not ready after 1s \(GET /ready.*warming up"):
            sup.start(spec, timeout_s=1)
    finally:
        sup.stop_all(grace_s=1)


def test_children_die_with_a_killed_supervisor(tmp_path: Path, free_ports: Any) -> None:
    port = free_ports.one()
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        from pathlib import Path
        from extproc.supervisor import ChildSpec, Supervisor, tcp_accepts
        sup = Supervisor(Path({str(tmp_path)!r}), threading.Event(), echo=None)
        argv = [sys.executable, "-c", {SERVE_PY!r}, "{port}", "ignore-sigterm"]
        child = sup.start(ChildSpec("c", argv, tcp_accepts("127.0.0.1", {port}), "up"), timeout_s=20)
        print(child.proc.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=REPO)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    family = descendants(parent.pid)
    assert child_pid in family
    parent.kill()
    parent.wait()
    assert wait_gone(family, 5) == []


# --- several models from a config file ---------------------------------------------------------------------


def _post_json(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_up_serves_two_models_from_a_config_file(tmp_path: Path, free_ports: Any) -> None:
    port = free_ports.one()
    config = tmp_path / "extproc.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            port = {port}
            admin_port = {free_ports.one()}
            listen = "127.0.0.1:{free_ports.one()}"
            metrics_port = {free_ports.one()}
            sim_port = {free_ports.block(3)}
            startup_timeout = {START_TIMEOUT_S}

            [[models]]
            name = "alpha"
            sim = 2

            [[models]]
            name = "beta"
            sim = 1
            routing_policy = "round_robin"
            engine_protocol = "sglang"
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTPROC_")}
    env["EXTPROC_CACHE_DIR"] = str(tmp_path / "cache")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # up's SQLite store: not in the user's home
    env["EXTPROC_CONFIG"] = str(config)
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "extproc", "up"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    try:
        announcement = "(models alpha (2 simulated engines), beta (1 simulated engine))"
        deadline = time.monotonic() + START_TIMEOUT_S * 3
        while announcement not in log.read_text():
            assert proc.poll() is None, f"extproc up exited with {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"stack not serving:\n{log.read_text()}"
            time.sleep(0.25)
        status, body = _get_json(f"http://127.0.0.1:{port}/v1/models")
        assert status == 200
        assert sorted(m["id"] for m in body["data"]) == ["alpha", "beta"]
        assert all(m["max_model_len"] > 0 for m in body["data"])
        for model in ("alpha", "beta"):
            status, reply = _post_json(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            )
            assert status == 200, reply
            assert reply["model"] == model
        text = log.read_text()
        # Each model's engines come from a simulator of its own, beta's speaking SGLang.
        assert "sim-alpha | engine 1 listening" in text and "sim-beta | engine 0 listening" in text
        assert "model=beta protocol=sglang" in text
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()
        assert wait_gone(family, 5) == [], f"left running after stop:\n{log.read_text()}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_serves_metrics_and_status_reads_them(
    tmp_path: Path, free_ports: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`extproc up` hands --metrics-port to its `extproc serve`, which serves /metrics and /engines there."""
    metrics_port = free_ports.one()
    with running_up(tmp_path, free_ports, "--metrics-port", str(metrics_port)) as (_, port, _):
        body = {"model": "llama3-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, _ = _post_json(f"http://127.0.0.1:{port}/v1/chat/completions", body)
        assert status == 200
        url = f"http://127.0.0.1:{metrics_port}"
        sample = 'extproc_requests_total{model="llama3-default",api="/v1/chat/completions",status="200"'
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert sample in text, text
        assert cli.main(["status", "--metrics-url", url]) == 0
        rows = capsys.readouterr().out.splitlines()[1:]
        assert len(rows) == 2 and all(" up " in row for row in rows), rows
