"""Several simulated engines in one process, each a gRPC server on its own port.

A gateway fronts a fleet of workers; one process hosting N engines on consecutive ports (or free ones)
gives a load test that fleet without N processes. The tokenizer and vocab scan are loaded once and
shared, so adding an engine costs only a server. Each engine can also serve `/metrics` and `/faults` over
HTTP on a port of its own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc, vllm_engine_pb2_grpc

from extproc.models import resolve_model_dir
from extproc.simulator.core import EngineCore, EngineStats
from extproc.simulator.engine import VllmEngine
from extproc.simulator.faults import FaultPlan
from extproc.simulator.http_control import ControlServer
from extproc.simulator.model import load_model_spec
from extproc.simulator.options import DEFAULT_OPTIONS, SimOptions
from extproc.simulator.request_log import RequestLog
from extproc.simulator.script import Script
from extproc.simulator.sglang import SglangEngine
from extproc.simulator.vocab import load_tokenizer, load_vocab

if TYPE_CHECKING:
    from extproc.simulator.zmq_publisher import ZmqKvPublisher

logger = logging.getLogger(__name__)

# How long stop() lets in-flight streams finish before cancelling them.
STOP_GRACE_S = 0.5
Protocol = Literal["vllm", "sglang"]
PROTOCOLS: tuple[Protocol, ...] = ("vllm", "sglang")
SERVICE_NAMES = {"vllm": "vllm.grpc.engine.VllmEngine", "sglang": "sglang.grpc.scheduler.SglangScheduler"}


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _health_service(server: grpc.aio.Server, protocol: Protocol) -> None:
    """The standard gRPC health service, where grpcio-health-checking is installed (vLLM serves it)."""
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    except ImportError:
        return
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", SERVICE_NAMES[protocol]):
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


@dataclass
class SimEngine:
    """One engine of a cluster: its servicer and the server hosting it."""

    servicer: VllmEngine | SglangEngine
    server: grpc.aio.Server
    host: str
    port: int
    protocol: Protocol = "vllm"
    control: ControlServer | None = None
    # vLLM's ZMQ KV-event channel, when switched on: one publisher per DP rank, in rank order.
    kv_publishers: list[ZmqKvPublisher] = field(default_factory=list)
    _refusal: asyncio.Task[None] | None = field(default=None, repr=False)
    restarts: int = 0  # completed `restart` calls
    _serving: bool = field(default=True, repr=False)

    @property
    def core(self) -> EngineCore:
        return self.servicer.core

    @property
    def stats(self) -> EngineStats:
        return self.servicer.stats

    @property
    def faults(self) -> FaultPlan:
        return self.core.faults

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def kv_publisher(self) -> ZmqKvPublisher | None:
        """Rank 0's ZMQ publisher (the engine's only one without data parallelism)."""
        return self.kv_publishers[0] if self.kv_publishers else None

    @property
    def metrics_port(self) -> int | None:
        return self.control.port if self.control is not None else None

    async def set_refusing(self, refuse: bool, previous: asyncio.Task[None] | None = None) -> None:
        """Stop the server (connections are refused) or bring it back on the same port."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)  # one change at a time, in order
        if refuse and self._serving:
            await self.server.stop(None)
            self._serving = False
        elif not refuse and not self._serving:
            self.server = await _bind(self.servicer, self.host, self.port, self.protocol)
            self._serving = True

    async def restart(self, down_s: float) -> None:
        """As the engine's process restarting: every call is cut (streams end with an error, KV-event
        subscriptions included), the port refuses connections for `down_s` seconds, and the engine comes
        back with an empty cache, numbering its KV-event batches from 0 on every channel. Returns once it
        is back (a `refuse` fault set meanwhile keeps the port closed)."""
        if down_s < 0:
            raise ValueError("down_s must be zero or positive")
        previous = self._refusal
        # Queued with the `refuse` changes, so that neither binds the port while the other holds it.
        self._refusal = task = asyncio.get_running_loop().create_task(self._restart(down_s, previous))
        await task

    async def _restart(self, down_s: float, previous: asyncio.Task[None] | None) -> None:
        await self.set_refusing(True, previous)
        self.core.restart()
        for publisher in self.kv_publishers:
            publisher.restart()
        await asyncio.sleep(down_s)
        await self.set_refusing(self.faults.settings.refuse)
        self.restarts += 1

    def _on_refuse(self, refuse: bool) -> None:
        previous = self._refusal
        self._refusal = asyncio.get_running_loop().create_task(self.set_refusing(refuse, previous))

    async def settled(self) -> None:
        """Wait until the last `refuse` change took effect (FaultPlan.set cannot wait itself)."""
        while self._refusal is not None and not self._refusal.done():
            await asyncio.gather(self._refusal, return_exceptions=True)

    async def stop(self, grace: float | None = STOP_GRACE_S) -> None:
        await self.server.stop(grace)
        await self.core.stop()
        if self.control is not None:
            await self.control.stop()
        await asyncio.gather(*(publisher.close() for publisher in self.kv_publishers))


@dataclass
class SimCluster:
    engines: list[SimEngine] = field(default_factory=list)
    request_log: RequestLog | None = None

    @property
    def script(self) -> Script:
        """The scripted outputs every engine of the cluster shares (`script.py`)."""
        return self.engines[0].core.script

    @property
    def addresses(self) -> list[str]:
        return [engine.address for engine in self.engines]

    async def stop(self, grace: float | None = STOP_GRACE_S) -> None:
        await asyncio.gather(*(engine.stop(grace) for engine in self.engines))
        if self.request_log is not None:
            self.request_log.close()


async def _bind(
    servicer: VllmEngine | SglangEngine, host: str, port: int, protocol: Protocol
) -> grpc.aio.Server:
    server = grpc.aio.server()
    if protocol == "vllm":
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    else:
        sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
    await _health_service(server, protocol)
    options = servicer.core.options
    try:
        if options.tls_cert is not None and options.tls_key is not None:
            bound = server.add_secure_port(format_address(host, port), _server_credentials(options))
        else:
            bound = server.add_insecure_port(format_address(host, port))
    except RuntimeError as e:  # recent grpcio raises where older ones returned 0
        raise OSError(f"cannot bind {format_address(host, port)}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot bind {format_address(host, port)}")
    await server.start()
    servicer.port = bound
    return server


def _server_credentials(options: SimOptions) -> grpc.ServerCredentials:
    """TLS from the options' PEM files (read at each bind, so a `refuse` cycle picks up new files)."""
    assert options.tls_cert is not None and options.tls_key is not None
    key, chain = Path(options.tls_key).read_bytes(), Path(options.tls_cert).read_bytes()
    client_ca = Path(options.tls_client_ca).read_bytes() if options.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


async def _serve(
    core: EngineCore, host: str, port: int, protocol: Protocol, metrics_port: int | None
) -> SimEngine:
    servicer: VllmEngine | SglangEngine
    if protocol == "vllm":
        servicer = VllmEngine(core.spec, core.vocab, core.options, core=core)
    else:
        servicer = SglangEngine(core)
    server = await _bind(servicer, host, port, protocol)
    engine = SimEngine(servicer, server, host, servicer.port, protocol)
    core.faults.on_refuse = engine._on_refuse
    if metrics_port is not None:
        engine.control = ControlServer(core, engine.restart)
        await engine.control.start(host, metrics_port)
    return engine


def _kv_publishers(engine: SimEngine, options: SimOptions, index: int, count: int) -> None:
    """Engine `index`'s ZMQ publishers, one per DP rank (each on its own endpoint, as in vLLM)."""
    # Imported here: pyzmq and msgpack are needed only when the channel is switched on.
    try:
        from extproc.simulator.zmq_publisher import ZmqKvPublisher
    except ImportError as e:
        raise RuntimeError(f"kv_events_zmq needs pyzmq and msgpack installed: {e}") from e
    for rank in range(options.data_parallel_size):
        # Appended one by one: a later rank failing to bind still leaves the earlier ones to close.
        publisher = ZmqKvPublisher.for_engine(options, index, count, rank)
        engine.kv_publishers.append(publisher)
        publisher.attach(engine.core.hub)


async def start_engines(
    model_dir: Path,
    *,
    count: int,
    base_port: int,
    host: str = "127.0.0.1",
    model_name: str | None = None,
    options: SimOptions = DEFAULT_OPTIONS,
    protocol: Protocol = "vllm",
    metrics_base_port: int | None = None,
    request_log: Path | None = None,
) -> SimCluster:
    """Start `count` engines on base_port, base_port+1, ... (base_port 0: each on a free port).

    `metrics_base_port` serves each engine's /metrics and /faults on metrics_base_port + i (0: free
    ports; None: no HTTP endpoint). `options.kv_events_zmq` adds vLLM's ZMQ KV-event publisher per engine
    and DP rank. `request_log` writes where each request went and which engines held its prompt
    (`request_log.py`).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    directory = resolve_model_dir(model_dir)
    tokenizer_json = (directory / "tokenizer.json").resolve()
    spec = load_model_spec(
        directory,
        model_name=model_name,
        max_model_len=options.max_model_len,
        tokenizer=load_tokenizer(tokenizer_json),
    )
    vocab = load_vocab(tokenizer_json)
    script = Script(options.script, spec.served_name)
    cluster = SimCluster()
    try:
        for i in range(count):
            port = base_port + i if base_port else 0
            metrics_port = (
                None if metrics_base_port is None else (metrics_base_port + i if metrics_base_port else 0)
            )
            core = EngineCore(spec, vocab, options, hash_seed=0, script=script)
            engine = await _serve(core, host, port, protocol, metrics_port)
            cluster.engines.append(engine)
            if options.kv_events_zmq is not None:
                _kv_publishers(engine, options, i, count)
        if request_log is not None:
            cores = [engine.core for engine in cluster.engines]
            cluster.request_log = RequestLog(request_log, cores)
            for core in cores:
                core.request_log = cluster.request_log
    except BaseException:
        await cluster.stop(grace=None)
        raise
    return cluster
