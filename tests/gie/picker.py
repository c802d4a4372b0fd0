"""extproc as an InferencePool's endpoint picker, for the conformance tests: simulated vLLM engines and the
extproc server (its real entry point, `extproc.server.start`) on a background loop, and nothing else —
the tests are the data plane (tests/gie/dataplane.py) and talk to its ext_proc port directly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc import server
from extproc.config import Settings
from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.cluster import SimEngine
from tests.gie.dataplane import ExtProcCall
from tests.integration.harness import DirectCalls, LoopThread, until


@dataclass
class Picker:
    running: server.Running
    engines: SimCluster
    loop: LoopThread
    channel: grpc.Channel

    @property
    def model(self) -> str:
        return self.running.model

    @property
    def addresses(self) -> list[str]:
        return list(self.engines.addresses)

    def call(self) -> ExtProcCall:
        return ExtProcCall(self.channel)

    def health(self, service: str) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)

    def generate_requests(self) -> int:
        return sum(e.stats.generate_requests for e in self.engines.engines)

    def set_ready(self, engine: SimEngine, ready: bool) -> None:
        """Make an engine fail (or pass) its health checks, and have the pool check at once."""
        engine.faults.set(unhealthy=not ready)
        self.loop.run(self.running.pool.check_all())

    def queue_on(self, engine: SimEngine, waiting: int) -> DirectCalls:
        """`waiting` requests queued on a stalled `engine` (sent to it directly, not through the picker),
        once its load reports have reached the router. The caller closes them (`release`)."""
        engine.faults.set(stall=True)

        async def queue_up() -> DirectCalls:
            direct = DirectCalls(engine)
            direct.start(waiting)
            await until(lambda: len(engine.core.scheduler.waiting) == waiting)
            await until(lambda: self._reported_waiting(engine.address) == waiting)
            return direct

        return self.loop.run(queue_up())

    def release(self, engine: SimEngine, direct: DirectCalls) -> None:
        self.loop.run(direct.close())
        engine.faults.clear()

    def _reported_waiting(self, address: str) -> int:
        for row in self.running.gateway.engines():
            if row["engine"] == address:
                return int(row["waiting"])
        return -1


@contextlib.contextmanager
def running_picker(*, engines: int = 2, sim: SimOptions | None = None, **settings: Any) -> Iterator[Picker]:
    """extproc picking among `engines` simulated engines; `settings`: further extproc settings."""
    loop = LoopThread()
    options = sim or SimOptions()
    cluster = loop.run(start_engines(default_model_dir(), count=engines, base_port=0, options=options))
    try:
        engine_urls = tuple(f"grpc://{a}" for a in cluster.addresses)
        config = Settings(listen="127.0.0.1:0", engines=engine_urls, **settings)
        running = loop.run(server.start(config, engine_wait_s=10))
        try:
            with grpc.insecure_channel(running.address) as channel:
                yield Picker(running, cluster, loop, channel)
        finally:
            loop.run(running.stop(grace=1))
    finally:
        loop.run(cluster.stop(grace=0))
        loop.close()
