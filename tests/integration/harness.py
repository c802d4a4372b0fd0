"""A real local stack for tests: simulated engines and the extproc server in a background event loop
(so tests can inspect the engines), and the real Envoy binary as a child process, all on free ports."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from extproc import server
from extproc.config import Settings
from extproc.envoy_bootstrap import EnvoyOptions, envoy_binary, render_bootstrap
from extproc.models import default_model_dir
from load.simulator import SimCluster, SimOptions, start_engines

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on its own thread, for servers that must keep running while tests block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


@dataclass
class Stack:
    base_url: str
    admin_url: str
    model: str
    engines: SimCluster
    gateway: server.Running
    envoy: subprocess.Popen[bytes]
    loop: LoopThread

    def generate_requests(self) -> int:
        """How many Generate calls reached any engine so far."""
        return sum(e.stats.generate_requests for e in self.engines.engines)


def wait_ready(admin_url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{admin_url}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError("envoy did not become ready")


@contextlib.contextmanager
def local_stack(
    ports: Any,
    tmp: Path,
    *,
    engines: int = 2,
    sim: SimOptions | None = None,
    routing_policy: str = "kv_events",
    max_body_bytes: int | None = None,
) -> Iterator[Stack]:
    loop = LoopThread()
    model_dir = default_model_dir()
    cluster = loop.run(start_engines(model_dir, count=engines, base_port=0, options=sim or SimOptions()))
    settings = Settings(
        listen="127.0.0.1:0",
        engines=tuple(f"grpc://{a}" for a in cluster.addresses),
        routing_policy=routing_policy,
        **({"max_body_bytes": max_body_bytes} if max_body_bytes else {}),
    )
    running = loop.run(server.start(settings, engine_wait_s=10))
    port, admin_port = ports.one(), ports.one()
    max_request_bytes = max_body_bytes or Settings().max_body_bytes
    options = EnvoyOptions(
        listen_port=port,
        admin_port=admin_port,
        extproc_target=running.address,
        max_request_bytes=max_request_bytes,
    )
    config = tmp / "envoy.json"
    config.write_text(render_bootstrap(options))
    envoy = subprocess.Popen(
        [
            envoy_binary(),
            "-c",
            str(config),
            "--log-level",
            "warning",
            "--use-dynamic-base-id",
            "--concurrency",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    stack = Stack(
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{admin_port}",
        running.model,
        cluster,
        running,
        envoy,
        loop,
    )
    try:
        wait_ready(stack.admin_url, envoy)
        yield stack
    finally:
        envoy.terminate()
        try:
            envoy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            envoy.kill()
            envoy.wait()
        loop.run(running.stop(grace=1))
        loop.run(cluster.stop())
        loop.close()
