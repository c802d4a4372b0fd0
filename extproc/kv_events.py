"""KV-event subscriptions: one asyncio task per engine streaming `SubscribeKvEvents`.

The pool's subscriber (`NativeKvEventSubscriber`) has the stream read natively (`_native.KvSubscription`):
each `KvEventBatch` goes from the wire to the router without Python, which hears back once per
subscription, when it ends. `KvEventSubscriber` reads the stream in Python instead and hands each batch,
as the bytes on the wire, to `on_batch(address, data)` (a caller that looks at every outcome, such as the
bench's index probe). A subscription always starts
from sequence 0 (the engine's current state, or a relay's snapshot) after `on_reset(address)` has made
the router forget what it knew of that engine; it is torn down and started again, after a backoff,
when the router reports a gap or a batch it cannot read, when the stream fails, or when it ends (an
engine restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc
import structlog
from smg_grpc_proto.generated import common_pb2

from extproc import _native
from extproc.grpc_tls import ClientTls

log = structlog.get_logger("extproc.kv_events")

# vLLM's method; an SGLang engine serves the same RPC (common.proto messages) under its own service name.
SUBSCRIBE_METHOD = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"

# Outcome kinds (`EventOutcome.kind()` on the Rust side) that need a fresh subscription.
RESYNC_OUTCOMES = frozenset({"gap", "malformed", "unknown_endpoint"})

OnBatch = Callable[[str, bytes], str]
OnReset = Callable[[str], None]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between subscriptions; it starts over once a stream has been healthy for
    `healthy_after_s`."""

    initial_s: float = 0.1
    max_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.2
    healthy_after_s: float = 10.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.factor**attempt)
        return base * (1 + self.jitter * (2 * random.random() - 1))


class BackgroundSubscriber:
    """One engine's subscription, run as a task from `start()` until `close()`: subscribes, and when the
    subscription ends (subclasses write `_subscription`, returning why) subscribes again after a backoff."""

    TASK_NAME = "subscription"
    # The log line of a resubscription.
    RESUBSCRIBING = "kv events resubscribing"

    def __init__(self, address: str, backoff: Backoff | None) -> None:
        self.address = address
        self._backoff = backoff or Backoff()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Set by `wake()`: the backoff between subscriptions ends early.
        self._woken = asyncio.Event()
        # Subscriptions that ended, and why the last one did (for metrics and tests).
        self.resyncs = 0
        self.last_reason: str | None = None

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name=f"{self.TASK_NAME} {self.address}")

    def wake(self) -> None:
        """Subscribe again now if waiting out a backoff (the engine is known to be back), with the
        backoff started over."""
        self._woken.set()

    async def close(self) -> None:
        """Stops the subscription and waits for its task to end."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        attempt = 0
        while True:
            started = time.monotonic()
            reason = await self._subscription()
            self.last_reason = reason
            self.resyncs += 1
            if time.monotonic() - started >= self._backoff.healthy_after_s:
                attempt = 0
            delay = self._retry_delay(attempt)
            attempt += 1
            log.info(self.RESUBSCRIBING, engine=self.address, reason=reason, delay_s=round(delay, 3))
            self._woken.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), delay)
                attempt = 0

    async def _subscription(self) -> str:
        """One subscription; returns why it ended."""
        raise NotImplementedError

    def _retry_delay(self, attempt: int) -> float:
        return self._backoff.delay(attempt)


class GrpcKvEventSubscriber(BackgroundSubscriber):
    """What the Python and the native readers of `SubscribeKvEvents` share: the router forgets the engine
    before each subscription from sequence 0, and an engine without the RPC is looked at again rarely."""

    _on_reset: OnReset
    subscriptions: int
    publishes: bool | None

    def _reset(self) -> bool:
        """Before a subscription: the router forgets what it knew; False when its handler failed."""
        try:
            self._on_reset(self.address)
        except Exception:
            log.exception("kv event reset handler failed", engine=self.address)
            return False
        self.subscriptions += 1
        return True

    def _retry_delay(self, attempt: int) -> float:
        # An engine without the RPC may be replaced by one with it: look again, rarely.
        return self._backoff.max_s if self.publishes is False else self._backoff.delay(attempt)


class KvEventSubscriber(GrpcKvEventSubscriber):
    """Keeps one engine's KV-event stream flowing into `on_batch` until `close()`."""

    TASK_NAME = "kv-events"

    def __init__(
        self,
        address: str,
        on_batch: OnBatch,
        on_reset: OnReset,
        *,
        backoff: Backoff | None = None,
        channel: grpc.aio.Channel | None = None,
        method: str = SUBSCRIBE_METHOD,
    ) -> None:
        super().__init__(address, backoff)
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._own_channel = channel is None
        self._channel = channel or grpc.aio.insecure_channel(address)
        self._subscribe = self._channel.unary_stream(
            method,
            request_serializer=common_pb2.SubscribeKvEventsRequest.SerializeToString,
            response_deserializer=None,
        )
        # What happened so far (for metrics and tests).
        self.subscriptions = 0
        self.batches = 0
        # False once the engine answered UNIMPLEMENTED: it publishes no events.
        self.publishes: bool | None = None

    async def close(self) -> None:
        """Stops the subscription (cancelling the stream), waits for the task to end, closes the channel
        it opened."""
        await super().close()
        if self._own_channel:
            await self._channel.close()

    async def _subscription(self) -> str:
        """One subscription from sequence 0; returns why it ended."""
        if not self._reset():
            return "handler error"
        request = common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=0, load_records_before_first_batch=True
        )
        call = self._subscribe(request)
        try:
            async for data in call:
                self.publishes = True
                self.batches += 1
                try:
                    outcome = self._on_batch(self.address, data)
                except Exception:
                    log.exception("kv event batch handler failed", engine=self.address)
                    return "handler error"
                if outcome in RESYNC_OUTCOMES:
                    return outcome
            return "stream ended"
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                if self.publishes is not False:
                    log.warning("engine publishes no kv events", engine=self.address)
                self.publishes = False
            return e.code().name
        finally:
            call.cancel()


class NativeKvEventSubscriber(GrpcKvEventSubscriber):
    """Keeps one engine's KV-event stream flowing into the router of `model` until `close()`: each
    subscription is a `_native.KvSubscription`, which applies every batch itself and reports only why it
    ended (a resync outcome, the stream's end, or its gRPC status code name)."""

    TASK_NAME = "kv-events"

    def __init__(
        self,
        address: str,
        gateway: _native.Gateway,
        model: str,
        on_reset: OnReset,
        *,
        backoff: Backoff | None = None,
        tls: ClientTls | None = None,
        method: str = SUBSCRIBE_METHOD,
    ) -> None:
        super().__init__(address, backoff)
        self._gateway = gateway
        self._model = model
        self._on_reset = on_reset
        self._tls = tls
        self._method = method
        # The subscription reading now, if any.
        self._stream: _native.KvSubscription | None = None
        # What happened so far (for metrics and tests).
        self.subscriptions = 0
        self._ended_batches = 0
        self._publishes: bool | None = None

    @property
    def batches(self) -> int:
        """Batches received, over every subscription."""
        stream = self._stream
        return self._ended_batches + (stream.batches if stream is not None else 0)

    @property
    def publishes(self) -> bool | None:
        """False once the engine answered UNIMPLEMENTED (it publishes no events); True once it sent one."""
        stream = self._stream
        if stream is not None and stream.batches > 0:
            return True
        return self._publishes

    async def _subscription(self) -> str:
        """One subscription from sequence 0; returns why it ended."""
        if not self._reset():
            return "handler error"
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[str] = loop.create_future()

        def on_end(reason: str) -> None:  # on a native thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_resolve, ended, reason)

        tls = self._tls
        try:
            stream = _native.KvSubscription(
                self._gateway,
                self._model,
                self.address,
                on_end,
                method=self._method,
                tls_ca=tls.ca if tls else None,
                tls_cert=tls.cert if tls else None,
                tls_key=tls.key if tls else None,
                tls_server_name=tls.server_name if tls else None,
            )
        except (ValueError, OSError):
            log.exception("kv event subscription cannot start", engine=self.address)
            return "handler error"
        self._stream = stream
        try:
            reason = await ended
        finally:
            stream.cancel()
            self._stream = None
            self._ended_batches += stream.batches
            if stream.batches > 0:
                self._publishes = True
        if reason == grpc.StatusCode.UNIMPLEMENTED.name:
            if self._publishes is not False:
                log.warning("engine publishes no kv events", engine=self.address)
            self._publishes = False
        return reason


def _resolve(future: asyncio.Future[str], reason: str) -> None:
    if not future.done():
        future.set_result(reason)


S = TypeVar("S", bound=BackgroundSubscriber)


class Subscriptions(Generic[S]):
    """Subscribers keyed by engine address, started when added and closed when removed, as the pool
    changes; one per address (adding it again keeps the running one, and ends a backoff it is waiting
    out: the pool adds an engine's subscription again when the engine is back from an outage)."""

    def __init__(self) -> None:
        self._subscribers: dict[str, S] = {}

    def __contains__(self, address: str) -> bool:
        return address in self._subscribers

    def get(self, address: str) -> S | None:
        return self._subscribers.get(address)

    def _add(self, address: str, make: Callable[[], S]) -> S:
        if address not in self._subscribers:
            sub = make()
            self._subscribers[address] = sub
            sub.start()
        else:
            self._subscribers[address].wake()
        return self._subscribers[address]

    async def remove(self, address: str) -> None:
        sub = self._subscribers.pop(address, None)
        if sub is not None:
            await sub.close()

    async def close(self) -> None:
        subs = list(self._subscribers.values())
        self._subscribers.clear()
        await asyncio.gather(*(s.close() for s in subs))


class KvEventSubscriptions(Subscriptions[KvEventSubscriber]):
    """The gRPC subscribers of a set of engines."""

    def __init__(self, on_batch: OnBatch, on_reset: OnReset, *, backoff: Backoff | None = None) -> None:
        super().__init__()
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._backoff = backoff

    def add(
        self, address: str, channel: grpc.aio.Channel | None = None, *, method: str = SUBSCRIBE_METHOD
    ) -> KvEventSubscriber:
        return self._add(
            address,
            lambda: KvEventSubscriber(
                address, self._on_batch, self._on_reset, backoff=self._backoff, channel=channel, method=method
            ),
        )


class NativeKvEventSubscriptions(Subscriptions[NativeKvEventSubscriber]):
    """The natively read subscriptions of a set of engines, each into the router of `model`."""

    def __init__(
        self,
        gateway: _native.Gateway,
        model: str,
        on_reset: OnReset,
        *,
        backoff: Backoff | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__()
        self._gateway = gateway
        self._model = model
        self._on_reset = on_reset
        self._backoff = backoff
        self._tls = tls

    def add(self, address: str, *, method: str = SUBSCRIBE_METHOD) -> NativeKvEventSubscriber:
        return self._add(
            address,
            lambda: NativeKvEventSubscriber(
                address,
                self._gateway,
                self._model,
                self._on_reset,
                backoff=self._backoff,
                tls=self._tls,
                method=method,
            ),
        )
