"""KV events over vLLM's ZMQ channel into the native router: simulated engines publish on real PUB sockets
(with vLLM's replay ROUTER socket or without), `extproc.kv_events_zmq` subscribes and feeds a real
`Gateway` with the `kv_events` policy, and picks made through a request stream follow the engine that
cached the prompt. A message lost on the way is replayed from the engine, or, without a replay socket,
the engine's index is reset and rebuilt from the next messages.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import msgpack
import pytest
import zmq
import zmq.asyncio
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc import _native
from extproc.kv_events import Backoff
from extproc.kv_events_zmq import ZmqEndpoint, ZmqKvEventSubscriber, ZmqKvEventSubscriptions
from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.cluster import SimEngine
from extproc.simulator.kv_cache import Cleared, Stored
from extproc.simulator.zmq_publisher import encode_batch
from load.vllm_engine import VllmProcess
from tests.conftest import DEFAULT_MODEL, default_gateway
from tests.integration.harness import generate_direct

MODEL = DEFAULT_MODEL
BLOCK = 16
TOPIC = "kv-events"
OPTIONS = SimOptions(ttft_ms=0.5, itl_ms=0.2, block_size=BLOCK, kv_events_zmq_topic=TOPIC)
FAST = Backoff(initial_s=0.05, max_s=0.5)

OnMessage = Callable[[str, int, bytes], str]


# The router's picks show what its index holds. Fresh engines priced apart (`fresh_cache_weight`) off: a
# flushed or restarted engine shows nothing cached and would take a pick whatever the others hold.
SETTLED = '{"seed": 7, "fresh_cache_weight": null}'


def prompt(seed: int, blocks: int = 4) -> list[int]:
    """`blocks` full blocks of distinct tokens, no block shared with another seed's prompt."""
    return list(range(seed * 1000, seed * 1000 + blocks * BLOCK))


# A direct request of two output tokens (a prefill step, then a decode step).
generate = functools.partial(generate_direct, max_tokens=2)


async def flush(engine: SimEngine | str) -> None:
    address = engine if isinstance(engine, str) else engine.address
    async with grpc.aio.insecure_channel(address) as channel:
        await pb_grpc.VllmEngineStub(channel).FlushCache(common_pb2.FlushCacheRequest())


def headers(**pairs: str) -> ep.HttpHeaders:
    return ep.HttpHeaders(
        headers=core.HeaderMap(
            headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        )
    )


def pick(gateway: _native.Gateway, tokens: list[int], model: str = MODEL) -> str:
    """The engine the router picks for a completion of `tokens`, through a request stream as Envoy drives it
    (the stream, and its in-flight count, end with this call)."""
    stream = gateway.new_stream()
    start = ep.ProcessingRequest(request_headers=headers(**{":method": "POST", ":path": "/v1/completions"}))
    stream.process(start.SerializeToString())
    body = json.dumps({"model": model, "prompt": tokens, "max_tokens": 1}).encode()
    stream.process(
        ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True)).SerializeToString()
    )
    endpoint = stream.summary()["endpoint"]
    assert isinstance(endpoint, str) and endpoint, stream.summary()
    return endpoint


def event_blocks(gateway: _native.Gateway, model: str = MODEL) -> int:
    _, stats = gateway.routing_stats(model)
    return int(stats.split("event_blocks: ")[1].split(",")[0])


def stores(payload: bytes, tokens: list[int]) -> bool:
    """Whether a vLLM payload stores a chain starting with `tokens` (test-side decoding only)."""
    _, events, _ = msgpack.unpackb(payload)
    return any(e["type"] == "BlockStored" and e["token_ids"][: len(tokens)] == tokens for e in events)


def setting(engine: SimEngine) -> str:
    """The pool's `kv_events` setting for an engine: zmq://host:port, with its replay port and topic."""
    publisher = engine.kv_publisher
    assert publisher is not None
    port = publisher.endpoint.rpartition(":")[2]
    query = f"topic={TOPIC}"
    if publisher.replay_endpoint is not None:
        query += f"&replay={publisher.replay_endpoint.rpartition(':')[2]}"
    return f"zmq://127.0.0.1:{port}?{query}"


async def eventually(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@dataclass
class Fleet:
    cluster: SimCluster
    gateway: _native.Gateway
    subscriptions: ZmqKvEventSubscriptions
    dropped: list[int]

    @property
    def a(self) -> SimEngine:
        return self.cluster.engines[0]

    @property
    def b(self) -> SimEngine:
        return self.cluster.engines[1]

    def subscriber(self, engine: SimEngine) -> ZmqKvEventSubscriber:
        sub = self.subscriptions.get(engine.address)
        assert sub is not None
        return sub

    async def settle(self) -> None:
        """Until each engine's every published batch reached the router."""
        for engine in self.cluster.engines:
            assert engine.kv_publisher is not None
            last = engine.kv_publisher.batches - 1
            sub = self.subscriber(engine)
            await eventually(
                lambda s=sub, n=last: s.applied == n, f"{engine.address}: batch {last} not applied"
            )


def lose_first(gateway: _native.Gateway, address: str, tokens: list[int], dropped: list[int]) -> OnMessage:
    """Hands messages to the gateway, except the first from `address` storing `tokens`: that one is lost on
    the way (the subscriber is told it was nothing new)."""

    def on_message(source: str, sequence: int, payload: bytes) -> str:
        if not dropped and source == address and stores(payload, tokens):
            dropped.append(sequence)
            return "duplicate"
        return gateway.apply_zmq_kv_events(MODEL, source, sequence, payload)

    return on_message


async def fleet_of(options: SimOptions, lose: list[int] | None = None) -> AsyncIterator[Fleet]:
    cluster = await start_engines(default_model_dir(), count=2, base_port=0, options=options)
    gateway = default_gateway(MODEL, policy="kv_events", routing_config=SETTLED)
    gateway.set_endpoints(MODEL, [(address, BLOCK) for address in cluster.addresses])
    dropped: list[int] = []
    on_message: OnMessage = lambda a, s, p: gateway.apply_zmq_kv_events(MODEL, a, s, p)  # noqa: E731
    if lose is not None:
        on_message = lose_first(gateway, cluster.addresses[0], lose, dropped)
    subs = ZmqKvEventSubscriptions(on_message, lambda a: gateway.reset_kv_events(MODEL, a), backoff=FAST)
    fleet = Fleet(cluster, gateway, subs, dropped)
    try:
        for engine in cluster.engines:
            subs.add(engine.address, setting(engine))
        # A SUB socket hears nothing until its subscription reached the publisher (ZMQ's slow joiner):
        # flush the idle caches (a Cleared batch each) until every subscriber has heard one.
        deadline = time.monotonic() + 10
        while not all(fleet.subscriber(e).messages for e in cluster.engines):
            assert time.monotonic() < deadline, "a subscriber never heard its engine"
            await asyncio.gather(*(flush(e) for e in cluster.engines))
            await asyncio.sleep(0.05)
        await fleet.settle()
        yield fleet
    finally:
        await subs.close()
        await cluster.stop(grace=None)


P, Q, R = prompt(1), prompt(2), prompt(3)


def with_replay(tmp_path: Path) -> SimOptions:
    return replace(OPTIONS, kv_events_zmq="tcp://*:0", kv_events_zmq_replay="tcp://*:0")


async def test_picks_follow_the_engine_that_cached_the_prompt(tmp_path: Path) -> None:
    async for fleet in fleet_of(with_replay(tmp_path)):
        await generate(fleet.a, P)
        await generate(fleet.b, Q)
        await fleet.settle()
        assert event_blocks(fleet.gateway) >= 8
        for _ in range(5):
            assert pick(fleet.gateway, P) == fleet.a.address
            assert pick(fleet.gateway, Q) == fleet.b.address
        # Evicted by a cache flush on A: P is no longer A's to serve better than B's.
        await flush(fleet.a)
        await fleet.settle()
        await generate(fleet.b, P[:BLOCK])
        await fleet.settle()
        assert pick(fleet.gateway, P) == fleet.b.address
        sub = fleet.subscriber(fleet.a)
        assert sub.resets == 1 and sub.last_reason is None, "one subscription, never resynchronized"


async def test_a_lost_message_is_replayed_from_the_engine(tmp_path: Path) -> None:
    async for fleet in fleet_of(with_replay(tmp_path), lose=P[:BLOCK]):
        await generate(fleet.b, P[:BLOCK])  # B holds P's first block: without A's store B would win
        await generate(fleet.a, P)  # its store is lost on the way
        await generate(fleet.a, R)  # the next message reveals the gap
        await fleet.settle()
        sub = fleet.subscriber(fleet.a)
        assert fleet.dropped, "the store of P was never seen"
        assert sub.replays >= 2 and sub.replayed >= 1, "the catch-up, then the gap's replay"
        assert sub.resets == 1, "the gap was filled without a reset"
        assert pick(fleet.gateway, P) == fleet.a.address
        assert pick(fleet.gateway, R) == fleet.a.address


async def test_without_replay_a_gap_resets_the_engine(tmp_path: Path) -> None:
    options = replace(OPTIONS, kv_events_zmq="tcp://*:0")
    async for fleet in fleet_of(options, lose=P[:BLOCK]):
        await generate(fleet.b, P[:BLOCK])
        await generate(fleet.b, R[:BLOCK])
        await generate(fleet.a, P)  # lost, and no replay socket to ask
        await generate(fleet.a, R)
        await fleet.settle()
        sub = fleet.subscriber(fleet.a)
        assert fleet.dropped and sub.replays == 0
        assert sub.resets == 2, "the subscription's reset, then the gap's"
        # A's index restarted after the gap: R (stored after it) is known, P (lost) is not.
        assert pick(fleet.gateway, R) == fleet.a.address
        assert pick(fleet.gateway, P) == fleet.b.address


def test_settings_parse_to_connectable_endpoints() -> None:
    assert ZmqEndpoint.parse("zmq://10.0.0.5:5557") == ZmqEndpoint("tcp://10.0.0.5:5557")
    assert ZmqEndpoint.parse("zmq://*:5557?replay=5567&topic=kv") == ZmqEndpoint(
        "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5567", "kv"
    )
    assert ZmqEndpoint.parse("ipc:///tmp/kv.ipc?replay=ipc:///tmp/r.ipc") == ZmqEndpoint(
        "ipc:///tmp/kv.ipc", "ipc:///tmp/r.ipc"
    )
    for bad in ("http://h:1", "grpc", "ipc:///tmp/kv.ipc?replay=5567"):
        with pytest.raises(ValueError):
            ZmqEndpoint.parse(bad)


class Publisher:
    """A bare PUB socket sending vLLM's messages (the simulator's encoder) with the sequences a test
    chooses: an engine that restarts, or sends a batch nobody can read."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.socket = zmq.asyncio.Context.instance().socket(zmq.PUB)
        self.socket.bind(endpoint)

    async def send(self, sequence: int, payload: bytes) -> None:
        await self.socket.send_multipart((b"", sequence.to_bytes(8, "big"), payload))

    def close(self) -> None:
        self.socket.close(linger=0)


def stored_batch(tokens: list[int], block: int = BLOCK) -> bytes:
    hashes = tuple(range(tokens[0], tokens[0] + len(tokens) // block))
    return encode_batch(time.time(), [Stored(hashes, None, tuple(tokens), block)])


async def test_restarts_unreadable_batches_and_lost_publishers(tmp_path: Path) -> None:
    a, b = "10.0.0.1:50051", "10.0.0.2:50051"
    gateway = default_gateway(MODEL, policy="kv_events", routing_config=SETTLED)
    gateway.set_endpoints(MODEL, [(a, BLOCK), (b, BLOCK)])
    # B holds the first block of every prompt here: A wins a pick only with what its events told.
    for n, tokens in enumerate((P, Q, R)):
        assert gateway.apply_zmq_kv_events(MODEL, b, n, stored_batch(tokens[:BLOCK])) == "applied"
    subs = ZmqKvEventSubscriptions(
        lambda s, n, p: gateway.apply_zmq_kv_events(MODEL, s, n, p),
        lambda s: gateway.reset_kv_events(MODEL, s),
        backoff=FAST,
    )
    endpoint = f"ipc://{tmp_path}/kv.ipc"
    publisher = Publisher(endpoint)
    try:
        sub = subs.add(a, endpoint)
        deadline = time.monotonic() + 10
        sequence = 100  # a subscription joins a running engine
        while not sub.messages:  # the slow joiner
            assert time.monotonic() < deadline
            sequence += 1
            await publisher.send(sequence, encode_batch(time.time(), [Cleared()]))
            await asyncio.sleep(0.05)
        await publisher.send(sequence + 1, stored_batch(P))
        await eventually(lambda: sub.applied == sequence + 1, "P's store")
        assert sub.resets == 1
        assert pick(gateway, P) == a

        # The engine restarted: its sequences start again at 0 and its cache is empty.
        await publisher.send(0, stored_batch(Q))
        await eventually(lambda: sub.applied == 0, "Q's store")
        assert sub.resets == 2
        assert (pick(gateway, P), pick(gateway, Q)) == (b, a)

        # A batch nobody can read loses its events: A's index starts over from the next one.
        await publisher.send(1, b"\x93not msgpack")
        await publisher.send(2, stored_batch(R))
        await eventually(lambda: sub.applied == 2, "R's store")
        assert sub.resets == 3
        assert (pick(gateway, Q), pick(gateway, R)) == (b, a)

        # The publisher goes away: the subscription starts over, from an empty index, and hears the new one.
        publisher.close()
        await eventually(lambda: sub.last_reason == "publisher disconnected", "the disconnect")
        assert pick(gateway, R) == b
        publisher = Publisher(endpoint)
        deadline = time.monotonic() + 10
        while sub.applied is None:
            assert time.monotonic() < deadline
            await publisher.send(0, stored_batch(P))
            await asyncio.sleep(0.05)
        assert sub.subscriptions == 2
        assert pick(gateway, P) == a
    finally:
        await subs.close()
        publisher.close()


@pytest.mark.real_engine
async def test_a_real_vllm_engine_feeds_the_router_over_zmq(real_vllm: VllmProcess) -> None:
    """vLLM's own publisher (the launcher's `--kv-events-config`: ipc://, topic "kv-events", no replay
    socket): its stores and its Cleared after FlushCache steer picks; its 128-token block size is learned
    from the events. The engine is the session's: a prompt it cached already would publish no store, so
    this test's prompt is its own."""
    engine = real_vllm
    model_dir = engine.model_dir
    gateway = _native.Gateway(max_body_bytes=1 << 20)
    gateway.add_model("tiny", str(model_dir), policy="kv_events", routing_config=SETTLED)
    other = "10.0.0.2:50051"
    gateway.set_endpoints("tiny", [(engine.address, 0), (other, 128)])
    # 300 tokens (two full 128-token blocks) starting with ids no other test's prompt starts with (the
    # contract suite's `Prompts` start below 91_000, the chat template with a header token).
    prompt = [128000, *range(100_000, 100_299)]
    # The other engine holds the prompt's first block: vLLM wins the pick only with what its events told.
    assert gateway.apply_zmq_kv_events("tiny", other, 0, stored_batch(prompt[:128], 128)) == "applied"
    subs = ZmqKvEventSubscriptions(
        lambda a, n, p: gateway.apply_zmq_kv_events("tiny", a, n, p),
        lambda a: gateway.reset_kv_events("tiny", a),
        backoff=FAST,
    )
    try:
        sub = subs.add(engine.address, ZmqEndpoint(engine.kv_events_endpoint, topic="kv-events"))
        deadline = time.monotonic() + 30
        warmup = 0
        while sub.applied is None:  # the slow joiner: warm-up prompts until a store arrives
            assert time.monotonic() < deadline, "no KV event from vLLM"
            warmup += 1
            await generate(engine.address, [128000, *range(20000 + 300 * warmup, 20000 + 300 * warmup + 199)])
            await asyncio.sleep(0.2)
        assert pick(gateway, prompt, "tiny") == other
        before = sub.applied
        await generate(engine.address, prompt)
        await eventually(lambda: sub.applied is not None and sub.applied > before, "the prompt's store")
        assert event_blocks(gateway, "tiny") >= 3  # vLLM's two blocks and the other engine's one
        assert pick(gateway, prompt, "tiny") == engine.address
        assert sub.resets == 1 and sub.replays == 0

        # FlushCache: vLLM publishes AllBlocksCleared with its next step's events (here another prompt's),
        # and the router forgets the blocks it held.
        before = sub.applied
        await flush(engine.address)
        await generate(engine.address, [128000, *range(40000, 40199)])
        await eventually(lambda: sub.applied is not None and sub.applied > before, "the Cleared batch")
        assert pick(gateway, prompt, "tiny") == other
    finally:
        await subs.close()
