"""Starting and gracefully stopping the ext_proc server, and the control plane beside it.

The ext_proc gRPC server is native (`_native.ExtProcServer`): its own thread runs every request stream
through the Rust state machine and sends engines `Abort` when a client goes away, without Python. This
process keeps the control plane: the engine pool and its health checks (which set the gateway's ready
endpoints), engine discovery (DNS names and Kubernetes Services whose engines come and go), and a reporter
that turns finished requests and server counters into logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass, field

import grpc
import structlog

from extproc import _native, api_keys, grpc_tls, request_traces
from extproc.config import ConfigError, Settings, served_models
from extproc.discovery.dns import Resolver, resolve_addresses
from extproc.discovery.kube_http import ApiUnavailable
from extproc.discovery.model_discovery import DiscoveryOptions, ModelDiscovery, is_discovered
from extproc.keys_reload import KeysReloader
from extproc.metrics_http import MetricsServer
from extproc.pool import EnginePool
from extproc.request_log import log_request
from extproc.request_traces import SpanWriter

log = structlog.get_logger("extproc.server")

ENGINE_WAIT_S = 30.0
STOP_GRACE_S = 5.0
# Threads serving ext_proc streams (their messages and HTTP/2 pings; large request bodies go to the
# `request_workers` pool): two, so one stream's slow step never holds up the connection's others.
WORKER_THREADS = 2
REPORT_INTERVAL_S = 1.0


@dataclass
class Running:
    server: _native.ExtProcServer
    # One engine pool per served model, in configuration order.
    pools: dict[str, EnginePool]
    gateway: _native.Gateway
    address: str
    reporter: Reporter | None = field(default=None, repr=False)
    # Follows the API keys file (None without one).
    keys: KeysReloader | None = field(default=None, repr=False)
    metrics: MetricsServer | None = field(default=None, repr=False)
    # Per model with discovered engines (DNS names, Kubernetes Services).
    discoveries: dict[str, ModelDiscovery] = field(default_factory=dict, repr=False)
    # Envoy's engines cluster over EDS (`xds_listen`), and where it is served.
    eds_server: grpc.aio.Server | None = field(default=None, repr=False)
    eds_address: str | None = None

    @property
    def model(self) -> str:
        """The first served model (the only one in a single-model configuration)."""
        return next(iter(self.pools))

    @property
    def pool(self) -> EnginePool:
        return self.pools[self.model]

    def serve_metrics(self, host: str, port: int) -> MetricsServer:
        """Serve `/metrics` and `/engines` on `host:port` (0: any free port) until `stop`."""
        try:
            self.metrics = MetricsServer(self.gateway, self.pools, host, port)
        except OSError as e:
            raise RuntimeError(f"cannot serve metrics on {host}:{port}: {e}") from e
        log.info("metrics served", url=self.metrics.url)
        return self.metrics

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)  # waits out the server's poll
        # Blocks until the server is down: off the event loop, so health checks and the reporter go on.
        await asyncio.to_thread(self.server.stop, grace)
        if self.reporter is not None:
            await self.reporter.stop()
        if self.keys is not None:
            await self.keys.stop()
        await asyncio.gather(*(d.close() for d in self.discoveries.values()))
        if self.eds_server is not None:
            await self.eds_server.stop(0)
        await asyncio.gather(*(pool.close() for pool in self.pools.values()))


class Reporter:
    """Logs what the native server finished: one line per request (`request_log`; else only requests
    whose client went away and failures), lost aborts; and writes each traced request's spans."""

    def __init__(
        self, server: _native.ExtProcServer, *, request_log: bool = False, spans: SpanWriter | None = None
    ) -> None:
        self._server = server
        self._request_log = request_log
        self._spans = spans
        self._aborts_failed = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop reporting periodically; report what is left once more."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.report()

    def report(self) -> None:
        for summary in self._server.take_summaries():
            if self._spans is not None:
                self._spans.write(summary)
            if self._request_log:
                log_request(summary)
            elif summary["aborted"]:
                log.info("client went away; engine request aborted", **summary)
            elif int(summary["status"]) >= 500:
                log.warning("request failed", **summary)
        stats = self._server.stats()
        if stats["aborts_failed"] > self._aborts_failed:
            log.warning("abort failed", count=stats["aborts_failed"] - self._aborts_failed)
            self._aborts_failed = stats["aborts_failed"]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            self.report()


async def start(
    settings: Settings, *, engine_wait_s: float = ENGINE_WAIT_S, resolve: Resolver = resolve_addresses
) -> Running:
    """Load the models, register their engines, start discovering the others, and start serving; returns
    once the server listens.

    Waits up to `engine_wait_s` for every model to have at least one healthy engine. `resolve`: how DNS
    names of engines are resolved (tests inject one)."""
    gateway = _native.Gateway(
        max_body_bytes=settings.max_body_bytes,
        destination_fallbacks=settings.destination_fallbacks,
        max_buffered_output_tokens=settings.max_buffered_output_tokens,
        first_token_timeout=settings.first_token_timeout,
        inter_token_timeout=settings.inter_token_timeout,
        response_in_envoy=settings.response_path == "module",
        responses_mcp_max_rounds=settings.responses_mcp_max_rounds,
    )
    spans = None
    if request_traces.tracing_wanted(settings.tracing):
        # Requests get trace ids in Rust only when their spans will be written.
        request_traces.configure()
        spans = SpanWriter()
        gateway.set_tracing(True)
    if settings.api_keys_file is not None:
        try:
            keys = api_keys.load_keys(settings.api_keys_file)
        except api_keys.KeysFileError as e:
            raise ConfigError(f"api_keys_file: {e}") from None
        gateway.set_api_keys([k.as_native() for k in keys])
        log.info("API keys required", keys=len(keys), file=str(settings.api_keys_file))
    try:
        tls_to_engines = grpc_tls.engine_tls(
            settings.engine_tls_ca, settings.engine_tls_cert, settings.engine_tls_key,
            settings.engine_tls_server_name,
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError(str(e)) from None
    pools: dict[str, EnginePool] = {}
    discoveries: dict[str, ModelDiscovery] = {}
    discovery = DiscoveryOptions(
        dns_refresh_interval_s=settings.dns_refresh_interval,
        kubernetes_api=settings.kubernetes_api,
        kubernetes_token_file=settings.kubernetes_token_file,
        kubernetes_ca_file=settings.kubernetes_ca_file,
        resolve=resolve,
    )
    for model in served_models(settings):
        try:
            gateway.add_model(
                model.name,
                str(model.model_dir),
                policy=model.routing_policy,
                routing_config=model.routing_config,
                tool_parser=model.tool_parser,
                reasoning_parser=model.reasoning_parser,
            )
        except ValueError as e:  # the router refused its settings, or the model directory is unusable
            raise ConfigError(f"model {model.name!r}: {e}") from None
        fixed = [e for e in model.engines if not is_discovered(e)]
        found = [e for e in model.engines if is_discovered(e)]
        pool = EnginePool.create(
            gateway, model.name, fixed, load_interval_s=settings.load_interval, tls=tls_to_engines
        )
        pools[model.name] = pool
        if found:
            try:
                discoveries[model.name] = ModelDiscovery(model.name, found, pool.set_discovered, discovery)
            except ApiUnavailable as e:
                raise ConfigError(f"model {model.name!r}: {e}") from None
    eds_server: grpc.aio.Server | None = None
    eds_address: str | None = None
    try:
        if settings.xds_listen is not None:
            from extproc.discovery import eds  # the Envoy protos: only when serving EDS

            engine_endpoints = eds.EngineEndpoints()

            def engines_changed() -> None:
                engine_endpoints.set_engines(e.address for pool in pools.values() for e in pool.engines)

            for pool in pools.values():
                pool.on_engines_changed = engines_changed
            engines_changed()
            try:
                eds_server, eds_address = await eds.serve(engine_endpoints, settings.xds_listen)
            except (OSError, RuntimeError) as e:
                raise RuntimeError(f"cannot serve EDS on {settings.xds_listen}: {e}") from e
            log.info("engines served over EDS", address=eds_address)
        for running_discovery in discoveries.values():
            running_discovery.start()
        await asyncio.gather(*(pool.start(wait_s=engine_wait_s) for pool in pools.values()))
        server = _native.ExtProcServer(
            gateway,
            settings.listen,
            worker_threads=WORKER_THREADS,
            request_workers=settings.request_workers,
            tls_cert=settings.listen_tls_cert,
            tls_key=settings.listen_tls_key,
            tls_client_ca=settings.listen_tls_client_ca,
            engine_tls_ca=settings.engine_tls_ca,
            engine_tls_cert=settings.engine_tls_cert,
            engine_tls_key=settings.engine_tls_key,
            engine_tls_server_name=settings.engine_tls_server_name,
            # Unset under `serve`: memory (`up` always passes its own, SQLite in its state directory).
            responses_store=settings.responses_store or "memory",
            module_stop_file=settings.module_stop_file,
        )
        try:
            address = server.start()
        except OSError as e:
            raise RuntimeError(f"cannot listen on {settings.listen}: {e}") from e
    except BaseException:
        await asyncio.gather(*(d.close() for d in discoveries.values()))
        if eds_server is not None:
            await eds_server.stop(0)
        await asyncio.gather(*(pool.close() for pool in pools.values()))
        raise
    reporter = Reporter(server, request_log=settings.request_log, spans=spans)
    reporter.start()
    keys = None
    if settings.api_keys_file is not None:
        keys = KeysReloader(gateway, settings.api_keys_file)
        keys.start()
    for name, pool in pools.items():
        ready = gateway.endpoints(name)
        log.info("serving model", model=name, engines=len(pool.engines), ready=len(ready))
    log.info("ext_proc server listening", address=address, models=list(pools))
    return Running(
        server, pools, gateway, address, reporter, keys,
        discoveries=discoveries, eds_server=eds_server, eds_address=eds_address,
    )  # fmt: skip


async def serve(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM, then stop gracefully (also while still waiting for engines)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(start(settings))

    def on_hangup() -> None:
        # Re-read the API keys file now (it is also polled); before the start, or without keys: nothing.
        if starting.done() and not starting.cancelled() and starting.exception() is None:
            keys = starting.result().keys
            if keys is not None:
                keys.reload_now()

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        log.info("stopped before the server started")
        return
    running = starting.result()
    if settings.metrics_port:
        try:
            running.serve_metrics(settings.metrics_host, settings.metrics_port)
        except RuntimeError:
            await running.stop(0)
            raise
    await stopping
    # Open streams get the grace period; the rest are ended and their engine requests aborted.
    log.info("stopping", grace_s=settings.shutdown_grace)
    await running.stop(settings.shutdown_grace)
