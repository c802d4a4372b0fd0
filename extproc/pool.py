"""The engine pool: engines from config, their health, block sizes and KV-event subscriptions, all
feeding the native router that picks an engine per request.

Python owns this control plane; the native gateway reads the state it is given.
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
from extproc.kv_events import KvEventSubscriptions

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
    # The engine's KV block size (GetServerInfo); 0 until known.
    block_size: int = 0


@dataclass
class EnginePool:
    """All engines of one served model, health-checked in the background, their KV events streamed
    into the router's prefix index."""

    gateway: _native.Gateway
    model: str
    engines: list[Engine] = field(default_factory=list)
    kv_events: bool = True
    _subscriptions: KvEventSubscriptions | None = None
    _health_task: asyncio.Task[None] | None = None

    @classmethod
    def create(
        cls, gateway: _native.Gateway, model: str, urls: list[str], *, kv_events: bool = True
    ) -> EnginePool:
        pool = cls(gateway=gateway, model=model, kv_events=kv_events)
        for url in urls:
            address = engine_address(url)
            channel = grpc.aio.insecure_channel(address)
            pool.engines.append(Engine(address, channel, pb_grpc.VllmEngineStub(channel)))
        # Every configured engine is known to the router from the start, unhealthy until its first check.
        gateway.set_endpoints(model, [(e.address, 0) for e in pool.engines])
        for engine in pool.engines:
            gateway.set_health(model, engine.address, False)
        return pool

    async def start(self, *, wait_s: float = 0.0) -> None:
        """Probe every engine once (waiting up to `wait_s` for at least one), then keep checking."""
        if self.kv_events:
            self._subscriptions = KvEventSubscriptions(self._on_batch, self._on_reset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            await self.check_all()
            if any(e.healthy for e in self.engines) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.2)
        self._health_task = asyncio.create_task(self._health_loop())

    def _on_batch(self, address: str, data: bytes) -> str:
        return self.gateway.apply_kv_events(self.model, address, data)

    def _on_reset(self, address: str) -> None:
        self.gateway.reset_kv_events(self.model, address)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(e) for e in self.engines))
        contexts = [e.max_context for e in self.engines if e.healthy and e.max_context]
        if contexts:
            self.gateway.set_max_context(self.model, min(contexts))

    async def _check(self, engine: Engine) -> None:
        try:
            reply = await engine.stub.HealthCheck(pb.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
            healthy = reply.healthy
            if healthy and engine.max_context is None:
                await self._register(engine)
        except grpc.aio.AioRpcError as e:
            healthy = False
            if engine.healthy:
                log.warning("engine unhealthy", engine=engine.address, code=e.code().name)
        if healthy and not engine.healthy:
            log.info("engine ready", engine=engine.address, max_context=engine.max_context)
            if self._subscriptions is not None:
                self._subscriptions.add(engine.address, engine.channel)
        engine.healthy = healthy
        self.gateway.set_health(self.model, engine.address, healthy)

    async def _register(self, engine: Engine) -> None:
        """What the router needs to know of an engine: its context length and KV block size."""
        info = await engine.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=HEALTH_TIMEOUT_S)
        server = await engine.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=HEALTH_TIMEOUT_S)
        engine.max_context = info.max_context_length or None
        engine.block_size = max(server.block_size, 0)
        self.gateway.set_endpoints(self.model, [(e.address, e.block_size) for e in self.engines])

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._subscriptions is not None:
            await self._subscriptions.close()
        for engine in self.engines:
            await engine.channel.close()
