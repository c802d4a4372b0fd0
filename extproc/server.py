"""Building, starting and gracefully stopping the ext_proc gRPC server."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass

import grpc
import structlog

from extproc import _native
from extproc.config import Settings
from extproc.models import resolve_model_dir, served_model_name
from extproc.pool import EnginePool
from extproc.servicer import ExternalProcessor

log = structlog.get_logger("extproc.server")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
ENGINE_WAIT_S = 30.0
STOP_GRACE_S = 5.0


@dataclass
class Running:
    server: grpc.aio.Server
    pool: EnginePool
    gateway: _native.Gateway
    model: str
    address: str

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        await self.server.stop(grace)
        await self.pool.close()


async def start(settings: Settings, *, engine_wait_s: float = ENGINE_WAIT_S) -> Running:
    """Load the model, register the engines and start serving; returns once the server listens."""
    model_dir = resolve_model_dir(settings.model_dir)
    model = served_model_name(model_dir, settings.model_name)
    gateway = _native.Gateway(max_body_bytes=settings.max_body_bytes)
    gateway.add_model(model, str(model_dir))
    pool = EnginePool.create(gateway, model, list(settings.engines))
    await pool.start(wait_s=engine_wait_s)

    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((ExternalProcessor(gateway, pool).handler(),))
    port = server.add_insecure_port(settings.listen)
    if port == 0 and not settings.listen.startswith("unix:"):
        raise RuntimeError(f"cannot listen on {settings.listen}")
    await server.start()
    address = (
        settings.listen
        if settings.listen.startswith("unix:")
        else f"{settings.listen.rsplit(':', 1)[0]}:{port}"
    )
    ready = gateway.endpoints(model)
    log.info(
        "ext_proc server listening", address=address, model=model, engines=len(pool.engines), ready=len(ready)
    )
    return Running(server, pool, gateway, model, address)


async def serve(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM, then stop gracefully (also while still waiting for engines)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(start(settings))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        log.info("stopped before the server started")
        return
    running = starting.result()
    await stopping
    log.info("stopping")
    await running.stop()
