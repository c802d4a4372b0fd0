"""KV events from vLLM's ZMQ publisher (`--kv-events-config`): the alternative to SubscribeKvEvents for
engines whose ZMQ socket the gateway can reach.

One asyncio task per engine holds a SUB socket on the engine's PUB endpoint. Each message is
`(topic, sequence as 8 bytes big-endian, msgpack payload)`; the sequence and the payload go undecoded to
`on_message(address, sequence, payload)` (the native router decodes and applies the batch, one crossing
per message) and the outcome kind it answers decides what happens next:

- `gap` (messages were lost; the router left the engine's index as it was): the missing sequences are
  asked from the engine's replay socket (vLLM's ROUTER: `(b"", start)` in, `(b"", topic, seq, payload)`
  per kept batch out, then an end marker) and offered in order, then the held message again. Without a
  replay socket, or when it no longer keeps them, the index is reset (`on_reset`) and the held message
  starts it afresh.
- `malformed`: that batch's events are lost: reset, and the next message starts afresh.
- `unknown_endpoint`: the router does not serve this engine (yet): subscribe again after a backoff.

A subscription starts with `on_reset`; with a replay socket its first message is preceded by a replay
from sequence 0, which rebuilds the engine's cache state from whatever history the publisher keeps (vLLM:
the last 10,000 batches). Sequences heard live only go up: a lower one means the engine restarted (its
numbers start again at 0), so the index is reset. A dropped connection (the engine went away) or a socket
error ends the subscription: a new one starts, after a reset, once the backoff has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from extproc.kv_events import BackgroundSubscriber, Backoff, Subscriptions

log = structlog.get_logger("extproc.kv_events_zmq")

OnMessage = Callable[[str, int, bytes], str]
OnReset = Callable[[str], object]

# A SUB socket keeps what arrives while a replay runs: as much as vLLM's PUB socket holds (its hwm).
RCV_HWM = 100_000
REPLAY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ZmqEndpoint:
    """Where an engine publishes: its PUB socket, its replay ROUTER socket (if any) and the topic."""

    events: str
    replay: str | None = None
    topic: str = ""

    @classmethod
    def parse(cls, setting: str) -> ZmqEndpoint:
        """`zmq://host:port[?replay=PORT_OR_ENDPOINT&topic=TOPIC]`, or a ZMQ endpoint (`tcp://`, `ipc://`)
        with the same query. A bind wildcard (`*`, `0.0.0.0`) in a host means this machine."""
        parts = urlsplit(setting)
        query = parse_qs(parts.query)
        base = setting.split("?", 1)[0]
        if parts.scheme == "zmq":
            base = "tcp://" + base.removeprefix("zmq://")
        elif parts.scheme not in ("tcp", "ipc"):
            raise ValueError(
                f"{setting!r}: a KV-event endpoint is zmq://host:port, tcp://host:port or ipc://path"
            )
        events = _connectable(base)
        replay = query.get("replay", [None])[-1]
        if replay is not None and replay.isdigit():
            if not events.startswith("tcp://"):
                raise ValueError(f"{setting!r}: a replay port needs a tcp endpoint")
            replay = f"{events.rpartition(':')[0]}:{replay}"
        return cls(events, None if replay is None else _connectable(replay), query.get("topic", [""])[-1])


def _connectable(endpoint: str) -> str:
    if endpoint.startswith("zmq://"):
        endpoint = "tcp://" + endpoint.removeprefix("zmq://")
    return endpoint.replace("*", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")


class _Restart(Exception):
    """The subscription must start over (the reason is the message)."""


class ZmqKvEventSubscriber(BackgroundSubscriber):
    """Keeps one engine's ZMQ KV events flowing into `on_message` until `close()` (which closes its
    sockets: they live inside the task)."""

    TASK_NAME = "kv-events-zmq"
    RESUBSCRIBING = "kv events resubscribing (zmq)"

    def __init__(
        self,
        address: str,
        endpoint: ZmqEndpoint,
        on_message: OnMessage,
        on_reset: OnReset,
        *,
        backoff: Backoff | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        super().__init__(address, backoff)
        self.endpoint = endpoint
        self._on_message = on_message
        self._on_reset = on_reset
        self._replay_timeout_ms = int(replay_timeout_s * 1000)
        self._context = context or zmq.asyncio.Context.instance()
        # The last sequence the router applied, and the last one heard on the SUB socket.
        self._applied: int | None = None
        self._heard: int | None = None
        # Replay the publisher's history before the next live message (a new subscription or engine).
        self._catch_up = False
        # What happened so far (for metrics and tests).
        self.subscriptions = 0
        self.messages = 0
        self.replays = 0
        self.replayed = 0
        self.resets = 0

    @property
    def applied(self) -> int | None:
        """The last sequence the router applied (None after a reset until the next one)."""
        return self._applied

    async def _subscription(self) -> str:
        """One subscription; returns why it ended."""
        self._heard = None
        try:
            self._reset(catch_up=True)
        except Exception:
            log.exception("kv event reset handler failed", engine=self.address)
            return "handler error"
        self.subscriptions += 1
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCV_HWM)
        sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            sub.connect(self.endpoint.events)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = await recv_monitor_message(monitor)
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        self._reset(catch_up=True)  # the engine went away: what it held is unknown
                        return "publisher disconnected"
                if sub in ready:
                    frames = await sub.recv_multipart()
                    if len(frames) != 3 or len(frames[1]) != 8:
                        log.warning("kv event message of unexpected shape", engine=self.address)
                        continue
                    await self._live(int.from_bytes(frames[1], "big"), frames[2])
        except _Restart as e:
            return str(e)
        except zmq.ZMQError as e:
            return f"zmq error: {e}"
        except Exception:
            log.exception("kv event message handler failed", engine=self.address)
            return "handler error"
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _live(self, sequence: int, payload: bytes) -> None:
        """One message from the SUB socket."""
        self.messages += 1
        if self._heard is not None and sequence <= self._heard:
            log.info("kv event sequence went back: engine restarted", engine=self.address, sequence=sequence)
            self._reset(catch_up=True)
        self._heard = sequence
        if self._catch_up:
            self._catch_up = False
            await self._replay(0)
        outcome = self._apply(sequence, payload)
        if outcome == "gap" and self._applied is not None:
            if await self._replay(self._applied + 1):
                outcome = self._apply(sequence, payload)
        if outcome == "gap":
            log.warning("kv events lost, not replayed: reset", engine=self.address, sequence=sequence)
            self._reset(catch_up=False)
            outcome = self._apply(sequence, payload)
        self._settle(sequence, outcome)

    def _apply(self, sequence: int, payload: bytes) -> str:
        outcome = self._on_message(self.address, sequence, payload)
        if outcome == "applied":
            self._applied = sequence
        elif outcome == "unknown_endpoint":
            raise _Restart(outcome)
        return outcome

    def _settle(self, sequence: int, outcome: str) -> None:
        if outcome == "malformed":
            log.warning("unreadable kv event batch: index reset", engine=self.address, sequence=sequence)
            self._reset(catch_up=False)

    def _reset(self, *, catch_up: bool) -> None:
        self._on_reset(self.address)
        self._applied = None
        self._catch_up = catch_up and self.endpoint.replay is not None
        self.resets += 1

    async def _replay(self, start: int) -> bool:
        """Offers the publisher's kept batches from `start` on; False when there is no replay socket, it
        does not answer in time, or it no longer keeps `start` (the router then reported a gap)."""
        if self.endpoint.replay is None:
            return False
        self.replays += 1
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.endpoint.replay)
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                if not await dealer.poll(self._replay_timeout_ms):
                    log.warning("kv event replay timed out", engine=self.address, start=start)
                    return False
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    return False
                sequence = int.from_bytes(frames[2], "big", signed=True)
                if sequence < 0:  # the end marker
                    return True
                self.replayed += 1
                outcome = self._apply(sequence, frames[3])
                if outcome == "gap":
                    return False
                self._settle(sequence, outcome)
        finally:
            dealer.close(linger=0)


class ZmqKvEventSubscriptions(Subscriptions[ZmqKvEventSubscriber]):
    """The ZMQ subscribers of a set of engines, added and removed as the pool changes (the counterpart of
    `kv_events.KvEventSubscriptions`)."""

    def __init__(
        self,
        on_message: OnMessage,
        on_reset: OnReset,
        *,
        backoff: Backoff | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self._on_message = on_message
        self._on_reset = on_reset
        self._backoff = backoff
        self._replay_timeout_s = replay_timeout_s

    def add(self, address: str, endpoint: ZmqEndpoint | str) -> ZmqKvEventSubscriber:
        """Subscribes `address` (the engine's gRPC address, as the router knows it) to `endpoint`; a no-op
        when it is subscribed already (remove it first to change the endpoint)."""
        where = endpoint if isinstance(endpoint, ZmqEndpoint) else ZmqEndpoint.parse(endpoint)
        return self._add(
            address,
            lambda: ZmqKvEventSubscriber(
                address,
                where,
                self._on_message,
                self._on_reset,
                backoff=self._backoff,
                replay_timeout_s=self._replay_timeout_s,
            ),
        )
