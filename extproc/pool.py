"""The engine pool: engines from config, their health, and the ready set the data plane routes to.

Python owns this control plane; the native gateway only reads the ready endpoints it is given. Aborting
the engine request of a client that went away is the native server's job (native/src/server/abort.rs).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
import structlog
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc import _native

log = structlog.get_logger("extproc.pool")

HEALTH_INTERVAL_S = 2.0
HEALTH_TIMEOUT_S = 1.0


def engine_address(url: str) -> str:
    """`grpc://host:port` → `host:port` (what Envoy's destination header carries)."""
    prefix = "grpc://"
    if not url.startswith(prefix) or ":" not in url[len(prefix) :]:
        raise ValueError(f"engine URL must look like grpc://host:port, got {url!r}")
    return url[len(prefix) :]


@dataclass
class Engine:
    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.VllmEngineStub
    healthy: bool = False
    max_context: int | None = None


@dataclass
class EnginePool:
    """All engines of one served model, health-checked in the background."""

    gateway: _native.Gateway
    model: str
    engines: list[Engine] = field(default_factory=list)
    _health_task: asyncio.Task[None] | None = None

    @classmethod
    def create(cls, gateway: _native.Gateway, model: str, urls: list[str]) -> EnginePool:
        pool = cls(gateway=gateway, model=model)
        for url in urls:
            address = engine_address(url)
            channel = grpc.aio.insecure_channel(address)
            pool.engines.append(Engine(address, channel, pb_grpc.VllmEngineStub(channel)))
        return pool

    async def start(self, *, wait_s: float = 0.0) -> None:
        """Probe every engine once (waiting up to `wait_s` for at least one), then keep checking."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            await self.check_all()
            if any(e.healthy for e in self.engines) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.2)
        self._health_task = asyncio.create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(e) for e in self.engines))
        ready = [e.address for e in self.engines if e.healthy]
        self.gateway.set_endpoints(self.model, ready)
        contexts = [e.max_context for e in self.engines if e.healthy and e.max_context]
        if contexts:
            self.gateway.set_max_context(self.model, min(contexts))

    async def _check(self, engine: Engine) -> None:
        try:
            reply = await engine.stub.HealthCheck(pb.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
            healthy = reply.healthy
            if healthy and engine.max_context is None:
                info = await engine.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HEALTH_TIMEOUT_S)
                engine.max_context = info.max_context_length or None
        except grpc.aio.AioRpcError as e:
            healthy = False
            if engine.healthy:
                log.warning("engine unhealthy", engine=engine.address, code=e.code().name)
        if healthy and not engine.healthy:
            log.info("engine ready", engine=engine.address, max_context=engine.max_context)
        engine.healthy = healthy

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        for engine in self.engines:
            await engine.channel.close()
