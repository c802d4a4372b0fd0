"""The engine pool of one served model: its engines' protocol, health, block sizes, loads and KV-event
subscriptions, all feeding the native router that picks an engine per request.

Python owns this control plane; the native gateway reads the state it is given.

Per engine, each health round: find its protocol (configured, or probed with HealthCheck under each
service name) → HealthCheck → on the first healthy answer, register it (context length, KV block size,
protocol, data-parallel size) with the gateway and subscribe to its KV events on the engine's channel:
SubscribeKvEvents over its gRPC address ("grpc", read natively on a connection of its own, with the
same TLS settings), vLLM's ZMQ publisher ("zmq://..."), or none ("off").
Exactly one channel per engine: both would feed the router's one sequence cursor per endpoint.
Separately, every `load_interval_s`, each healthy engine's GetLoads goes to the router (ZMQ messages
carry no load).

An engine of DP size N > 1 is N router endpoints, `"{address}#{rank}"`, each rank with its own KV cache,
load and event cursor: its GetLoads is reported rank by rank, its one SubscribeKvEvents stream carries
every rank's batches (the router files each under its `dp_rank`), and health applies to all its ranks.
A ZMQ publisher is one rank's (vLLM binds one per rank): only the ranks it publishes get events.

Discovered engines (extproc.discovery) come and go while serving, through `set_discovered`: a new one is
probed at once and reaches the router only once registered (so no request meets an engine not yet
checked); a draining one stays known but unhealthy to the router (its open requests finish, new ones go
elsewhere) until it is ready again or gone; a gone one is dropped from the router, its channel and KV-event
subscription closed. Configured engines are never touched by discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import structlog

from extproc import _native, grpc_tls
from extproc.config import EngineConfig, engine_address, is_zmq_source
from extproc.engine_client import (
    EngineClient,
    EngineLoad,
    NoKnownProtocol,
    Protocol,
    configured_protocol,
    detect_protocol,
    subscribe_method,
)
from extproc.grpc_tls import ClientTls
from extproc.kv_events import NativeKvEventSubscriber, NativeKvEventSubscriptions

if TYPE_CHECKING:  # imported at run time only when an engine uses ZMQ: it brings pyzmq
    from extproc.discovery.model_discovery import DiscoveredEngine
    from extproc.kv_events_zmq import ZmqKvEventSubscriber, ZmqKvEventSubscriptions

log = structlog.get_logger("extproc.pool")

HEALTH_INTERVAL_S = 2.0
# An engine out of rotation is checked this often instead: one that restarts takes requests again within
# this of being back (at 2 s it waited 2.0-3.6 s with an empty cache while the others ran over). An engine
# that stays down costs one pending HealthCheck at a time (it waits for the connection up to its timeout).
UNHEALTHY_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 1.0
# gRPC's reconnect backoff grows to 120 s by default: an engine that restarts after a few seconds down would
# stay unreachable (and unhealthy here) long after it is back. Capped well under HEALTH_TIMEOUT_S: a check
# that waits for the connection while the engine comes back must see it within its timeout, or its late
# failure takes the live engine out for a whole interval (the KV-event stream no longer shares this
# channel to make it reconnect sooner).
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 250))
LOAD_INTERVAL_S = 0.5


@dataclass
class Engine:
    address: str
    channel: grpc.aio.Channel
    # The configured protocol; None: detect it.
    configured: Protocol | None = None
    # Set once the protocol is known (configured or detected).
    client: EngineClient | None = None
    healthy: bool = False
    registered: bool = False
    max_context: int | None = None
    # The engine's KV block size (GetServerInfo); 0 until known.
    block_size: int = 0
    # Its data-parallel ranks (GetServerInfo); 1 until known. Each rank is a router endpoint of its own.
    dp_size: int = 1
    # Why the engine cannot be used, logged once per distinct reason.
    problem: str | None = None
    # False once GetLoads answered UNIMPLEMENTED (until the engine registers again).
    reports_load: bool = True
    # Where its KV events come from: "grpc", "off" or vLLM's ZMQ publisher ("zmq://...").
    kv_events: str = "grpc"
    # Whether the ZMQ source was refused for an SGLang engine (warned once).
    zmq_refused: bool = False
    # Found by discovery (else configured): added, drained and removed while serving.
    discovered: bool = False
    # Takes no new requests (a discovered endpoint not ready, or terminating); open ones finish.
    draining: bool = False
    # Known to the router: configured engines from the start, discovered ones once first registered.
    published: bool = True
    # Held while a health check of it runs: checks come from the loops, probes and tests at once, and a
    # check asked for while another runs follows it (so it sees the engine as it is after the ask).
    check_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def protocol(self) -> Protocol | None:
        return self.client.protocol if self.client is not None else self.configured


@dataclass
class EnginePool:
    """All engines of one served model, health-checked and load-polled in the background, their KV
    events streamed into the router's prefix index."""

    gateway: _native.Gateway
    model: str
    engines: list[Engine] = field(default_factory=list)
    kv_events: bool = True
    load_interval_s: float = LOAD_INTERVAL_S
    _subscriptions: NativeKvEventSubscriptions | None = None
    _zmq_subscriptions: ZmqKvEventSubscriptions | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Probes of engines that just appeared or became ready again (not waiting for the health loop).
    _probes: set[asyncio.Task[None]] = field(default_factory=set)
    tls: ClientTls | None = None
    # Called when engines join or leave (what Envoy's EDS engines cluster follows).
    on_engines_changed: Callable[[], None] | None = None

    @classmethod
    def create(
        cls,
        gateway: _native.Gateway,
        model: str,
        engines: Sequence[str | EngineConfig],
        *,
        kv_events: bool = True,
        load_interval_s: float = LOAD_INTERVAL_S,
        tls: ClientTls | None = None,
    ) -> EnginePool:
        """`engines`: URLs (protocol detected, KV events over gRPC) or EngineConfigs (protocol "auto", "vllm"
        or "sglang"; kv_events "grpc", "off" or a ZMQ URL, None meaning "grpc"). `tls`: every engine's
        channel over TLS (the KV-event subscription's too)."""
        pool = cls(
            gateway=gateway, model=model, kv_events=kv_events, load_interval_s=load_interval_s, tls=tls
        )
        for item in engines:
            config = item if isinstance(item, EngineConfig) else EngineConfig(item)
            pool.engines.append(pool._new_engine(engine_address(config.url), config))
        # Every configured engine is known to the router from the start, unhealthy until its first check.
        pool._publish_endpoints()
        for engine in pool.engines:
            gateway.set_health(model, engine.address, False)
        return pool

    def _new_engine(self, address: str, config: EngineConfig, *, discovered: bool = False) -> Engine:
        channel = grpc_tls.channel(address, self.tls, list(CHANNEL_OPTIONS))
        configured = configured_protocol(config.protocol)
        engine = Engine(address, channel, configured, kv_events=config.kv_events or "grpc")
        if configured is not None:
            engine.client = EngineClient(channel, configured)
        engine.discovered = discovered
        engine.published = not discovered
        return engine

    def _publish_endpoints(self) -> None:
        # An engine whose protocol is still unknown is unhealthy, so the placeholder is never used.
        endpoints = [
            (e.address, e.block_size, e.protocol or "vllm", e.dp_size) for e in self.engines if e.published
        ]
        self.gateway.set_endpoints(self.model, endpoints)

    def _known(self, engine: Engine) -> bool:
        """Still one of the pool's engines (not removed by discovery while it was being checked)."""
        return any(e is engine for e in self.engines)

    def _probe(self, engine: Engine, *, wait_for_ready: bool = True) -> None:
        """Check `engine` now rather than at the next health round."""
        task = asyncio.create_task(self._check(engine, wait_for_ready), name=f"probe {engine.address}")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def set_discovered(self, wanted: Mapping[str, DiscoveredEngine]) -> None:
        """Make the discovered engines exactly `wanted` (by address): new ones are probed now, draining
        ones stop taking requests at once, missing ones are dropped. Configured engines stay as they are."""
        by_address = {e.address: e for e in self.engines}
        added: list[Engine] = []
        for address, found in wanted.items():
            engine = by_address.get(address)
            if engine is None:
                engine = self._new_engine(address, found.config, discovered=True)
                engine.draining = not found.ready
                added.append(engine)
            elif not engine.discovered:
                continue  # a configured engine is never drained or removed by discovery
            elif not found.ready and not engine.draining:
                engine.draining = True
                self.gateway.set_health(self.model, address, False)
                log.info("engine draining: no new requests", model=self.model, engine=address)
            elif found.ready and engine.draining:
                engine.draining = False
                log.info("engine ready again", model=self.model, engine=address)
                self._probe(engine)
        gone = [e for e in self.engines if e.discovered and e.address not in wanted]
        self.engines = [e for e in self.engines if not (e.discovered and e.address not in wanted)] + added
        if gone:
            self._publish_endpoints()
        if (gone or added) and self.on_engines_changed is not None:
            self.on_engines_changed()  # before the first probe: Envoy knows an engine before it is routed to
        for engine in added:
            log.info("engine discovered", model=self.model, engine=engine.address, draining=engine.draining)
            if not engine.draining:
                self._probe(engine)
        for engine in gone:
            log.info("engine gone", model=self.model, engine=engine.address)
            await self._unsubscribe(engine)
            await engine.channel.close()

    async def start(self, *, wait_s: float = 0.0) -> None:
        """Probe every engine once (waiting up to `wait_s` for at least one), then keep checking."""
        self._open_subscriptions()
        if self.kv_events:
            if any(is_zmq_source(e.kv_events) for e in self.engines):
                from extproc.kv_events_zmq import ZmqKvEventSubscriptions

                self._zmq_subscriptions = ZmqKvEventSubscriptions(self._on_zmq_message, self._on_reset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            await self.check_all()
            if any(e.healthy for e in self.engines) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.2)
        self._tasks.append(asyncio.create_task(self._health_loop(), name=f"health {self.model}"))
        self._tasks.append(asyncio.create_task(self._unhealthy_loop(), name=f"unhealthy {self.model}"))
        if self.load_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._load_loop(), name=f"loads {self.model}"))

    def _open_subscriptions(self) -> None:
        # Also on a discovered engine's first probe, which may come before `start`.
        if self.kv_events and self._subscriptions is None:
            # Read natively: each batch goes from the wire to the router without Python.
            self._subscriptions = NativeKvEventSubscriptions(
                self.gateway, self.model, self._on_reset, tls=self.tls
            )

    def _on_zmq_message(self, address: str, sequence: int, payload: bytes) -> str:
        return self.gateway.apply_zmq_kv_events(self.model, address, sequence, payload)

    def _on_reset(self, address: str) -> None:
        self.gateway.reset_kv_events(self.model, address)
        # A subscription to an engine in rotation ended (this is the next one starting): most often the
        # engine went away. Check it now rather than at the next round, so that no request is sent to a
        # dead engine for up to a whole interval (each would fail over, and count against it); without
        # waiting for a connection, so that a refused one takes it out at once, where a round's check
        # waits out two timeouts. A live engine, however slow, is not taken out by a refusal.
        subscriber = self.kv_event_subscriber(address)
        engine = next((e for e in self.engines if e.address == address), None)
        if engine is not None and engine.healthy and subscriber is not None and subscriber.subscriptions > 0:
            self._probe(engine, wait_for_ready=False)

    def kv_event_subscriber(self, address: str) -> NativeKvEventSubscriber | ZmqKvEventSubscriber | None:
        """The engine's KV-event subscription, on whichever channel it uses; None when it has none."""
        for subscriptions in (self._subscriptions, self._zmq_subscriptions):
            sub = subscriptions.get(address) if subscriptions is not None else None
            if sub is not None:
                return sub
        return None

    def _subscribe(self, engine: Engine) -> None:
        """Subscribes a healthy engine of known protocol to its KV events on its one channel."""
        self._open_subscriptions()
        if self._subscriptions is None or engine.protocol is None or engine.kv_events == "off":
            return
        if is_zmq_source(engine.kv_events):
            if engine.protocol == "vllm" and self._zmq_subscriptions is not None:
                self._zmq_subscriptions.add(engine.address, engine.kv_events)
                return
            if not engine.zmq_refused:
                # The config refuses ZMQ for a configured SGLang engine; a detected one falls back to gRPC.
                log.warning(
                    "kv_events is vLLM's ZMQ publisher but the engine speaks SGLang: using SubscribeKvEvents",
                    model=self.model,
                    engine=engine.address,
                    kv_events=engine.kv_events,
                )
                engine.zmq_refused = True
        self._subscriptions.add(engine.address, method=subscribe_method(engine.protocol))

    async def _unsubscribe(self, engine: Engine) -> None:
        for subscriptions in (self._subscriptions, self._zmq_subscriptions):
            if subscriptions is not None:
                await subscriptions.remove(engine.address)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.check_all()

    async def _unhealthy_loop(self) -> None:
        while True:
            await asyncio.sleep(UNHEALTHY_INTERVAL_S)
            await self.check_all(only_unhealthy=True)

    async def check_all(self, *, only_unhealthy: bool = False) -> None:
        engines = [e for e in self.engines if not (only_unhealthy and e.healthy)]
        if not engines:
            return  # nothing checked, nothing changed (the unhealthy loop, every 0.5 s on a healthy pool)
        await asyncio.gather(*(self._check(e) for e in engines))
        contexts = [e.max_context for e in self.engines if e.healthy and e.max_context]
        if contexts:
            self.gateway.set_max_context(self.model, min(contexts))

    def _report_problem(self, engine: Engine, problem: str | None) -> None:
        """Log why an engine is out of rotation, once per distinct reason."""
        if problem is not None and problem != engine.problem:
            log.warning("engine not usable", model=self.model, engine=engine.address, reason=problem)
        engine.problem = problem

    async def _check(self, engine: Engine, wait_for_ready: bool = True) -> None:
        async with engine.check_lock:
            if engine.draining and not engine.published:
                return  # discovered not ready: nothing to learn until it is
            try:
                await self._check_once(engine, wait_for_ready)
            except grpc.aio.UsageError:
                if self._known(engine):
                    raise
                # Removed by discovery mid-check: its channel was closed under the next call.

    async def _check_once(self, engine: Engine, wait_for_ready: bool) -> None:
        healthy = False
        try:
            client = await self._client(engine)
            healthy = await self._ask_health(engine, client, wait_for_ready)
            if healthy and not engine.registered:
                await self._register(engine, client)
            self._report_problem(engine, None if healthy else "HealthCheck answered healthy=false")
        except NoKnownProtocol as e:
            self._report_problem(engine, f"speaks neither vLLM nor SGLang: {e}")
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._report_problem(engine, f"does not implement the {engine.protocol} protocol")
                if engine.configured is None:
                    # A detected engine was replaced by one of the other protocol: detect again, and
                    # subscribe to its events under the new service name once it is back.
                    engine.client = None
                    engine.zmq_refused = False
                    await self._unsubscribe(engine)
            else:
                self._report_problem(engine, f"health check failed: {e.code().name}")
        if not self._known(engine):
            return  # removed by discovery meanwhile: its channel is closed, the router forgot it
        if healthy and not engine.healthy:
            log.info(
                "engine ready",
                model=self.model,
                engine=engine.address,
                protocol=engine.protocol,
                max_context=engine.max_context,
                block_size=engine.block_size,
                dp_size=engine.dp_size,
            )
            # Back from an outage, its subscription may be waiting out a backoff of seconds while the
            # router sends it requests blind to what it caches: adding it again subscribes now.
            self._subscribe(engine)
        if not healthy:
            # Whatever comes back (a restart, another build) is registered afresh.
            engine.registered = False
        engine.healthy = healthy
        if engine.published:
            self.gateway.set_health(self.model, engine.address, healthy and not engine.draining)

    async def _ask_health(self, engine: Engine, client: EngineClient, wait_for_ready: bool) -> bool:
        """One health check; a timed-out one of an engine in rotation is asked once more."""
        try:
            return await client.healthy(HEALTH_TIMEOUT_S, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as e:
            # One timeout is not a dead engine. Over a live connection it is an engine slow to answer
            # (busy, or warming up): taking it out would refuse requests it serves, every engine at once
            # when all are busy. Over a reconnecting one it can be the tail of a short outage: the check
            # began while the engine restarted, and the channel reconnects (at most 250 ms apart) just
            # after its deadline. A dead engine leaves on the second timeout, one timeout later; its
            # requests meanwhile fail over to other engines (the router's penalty).
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED or not engine.healthy:
                raise
            return await client.healthy(HEALTH_TIMEOUT_S, wait_for_ready=wait_for_ready)

    async def _client(self, engine: Engine) -> EngineClient:
        if engine.client is None:
            protocol = await detect_protocol(engine.channel, HEALTH_TIMEOUT_S)
            log.info("engine protocol detected", model=self.model, engine=engine.address, protocol=protocol)
            engine.client = EngineClient(engine.channel, protocol)
        return engine.client

    async def _register(self, engine: Engine, client: EngineClient) -> None:
        """What the router needs to know of an engine: its protocol, context length, KV block size and
        data-parallel size."""
        facts = await client.model_facts(HEALTH_TIMEOUT_S)
        engine.max_context = facts.max_context
        engine.block_size = facts.block_size
        engine.dp_size = facts.dp_size
        engine.registered = True
        engine.reports_load = True
        if not self._known(engine):
            return
        # A draining engine that registers again is published unhealthy: the router starts new ones healthy.
        first = not engine.published
        engine.published = True
        self._publish_endpoints()
        if first and engine.draining:
            self.gateway.set_health(self.model, engine.address, False)

    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(self.load_interval_s)
            await self.poll_loads()

    async def poll_loads(self) -> None:
        """One GetLoads round over the healthy engines; each answer goes to the router."""
        due = [e for e in self.engines if e.healthy and e.client is not None and e.reports_load]
        await asyncio.gather(*(self._poll_load(e) for e in due))

    async def _poll_load(self, engine: Engine) -> None:
        assert engine.client is not None
        timeout_s = min(HEALTH_TIMEOUT_S, max(self.load_interval_s, 0.1))
        by_rank: dict[int | None, EngineLoad]
        try:
            if engine.dp_size > 1:
                # Each rank is its own endpoint: its own load. A reply without per-rank loads (SGLang's
                # aggregate alone) reports nothing; the router then goes by its in-flight counts.
                by_rank = dict(await engine.client.loads_by_rank(timeout_s))
            else:
                by_rank = {None: await engine.client.loads(timeout_s)}
        except grpc.aio.UsageError:
            if self._known(engine):
                raise
            return  # removed by discovery mid-poll: its channel is closed
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                engine.reports_load = False
                log.warning("engine has no GetLoads; routing uses in-flight counts", engine=engine.address)
            return  # the health check decides whether the engine is still usable
        for rank, load in by_rank.items():
            self._report_load(engine, load, rank)

    def _report_load(self, engine: Engine, load: EngineLoad, rank: int | None) -> None:
        self.gateway.report_load(self.model, engine.address, load, dp_rank=rank)

    async def close(self) -> None:
        for task in [*self._tasks, *self._probes]:
            task.cancel()
        for task in self._probes.copy():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.gather(
            *(s.close() for s in (self._subscriptions, self._zmq_subscriptions) if s is not None)
        )
        for engine in self.engines:
            await engine.channel.close()
