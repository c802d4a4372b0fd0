"""KV-event subscriber against a real grpc.aio server streaming real `common_pb2.KvEventBatch` messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.kv_events import Backoff, KvEventSubscriber, KvEventSubscriptions

FAST = Backoff(initial_s=0.05, max_s=0.4, factor=2.0, jitter=0.0)


def batch(seq: int, *, snapshot: tuple[int, int] | None = None) -> common_pb2.KvEventBatch:
    b = common_pb2.KvEventBatch(sequence_number=seq, timestamp=time.time())
    if snapshot is not None and snapshot[0] == 0:
        b.events.add(event_id=0).cleared.SetInParent()
    stored = b.events.add(event_id=seq).stored
    stored.blocks.add(block_hash=seq * 10, token_ids=[seq] * 16, block_size=16)
    if snapshot is not None:
        b.snapshot.index, b.snapshot.count = snapshot
    b.load.running_requests = seq
    return b


# One subscription's script: batches to send, then how the stream ends.
HANG, END, ABORT = "hang", "end", "abort"


@dataclass
class Script:
    batches: list[common_pb2.KvEventBatch]
    then: str = HANG


@dataclass
class Engine(pb_grpc.VllmEngineServicer):
    """A vLLM-protocol engine that only streams KV events, one script per subscription."""

    scripts: list[Script]
    requests: list[common_pb2.SubscribeKvEventsRequest] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def SubscribeKvEvents(self, request, context):
        self.requests.append(request)
        self.started_at.append(time.monotonic())
        script = self.scripts[min(len(self.requests), len(self.scripts)) - 1]
        try:
            for b in script.batches:
                yield b
            if script.then == ABORT:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine going away")
            if script.then == HANG:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@dataclass
class Router:
    """Stands in for the native router: reads the bytes with the real protos, checks the sequence."""

    received: list[bytes] = field(default_factory=list)
    resets: int = 0
    last: int | None = None

    def on_reset(self, address: str) -> None:
        self.resets += 1
        self.last = None

    def on_batch(self, address: str, data: bytes) -> str:
        assert isinstance(data, bytes)
        self.received.append(data)
        seq = common_pb2.KvEventBatch.FromString(data).sequence_number
        if self.last is not None and seq != self.last + 1:
            return "gap"
        self.last = seq
        return "applied"


async def serve(engine: pb_grpc.VllmEngineServicer | None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    if engine is not None:
        pb_grpc.add_VllmEngineServicer_to_server(engine, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def until(cond: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_batches_arrive_as_the_bytes_on_the_wire_and_a_gap_resubscribes_from_zero():
    first = [batch(1), batch(2), batch(4), batch(5)]  # 3 is lost
    resync = [batch(20, snapshot=(0, 2)), batch(21, snapshot=(1, 2)), batch(22)]
    engine = Engine([Script(first), Script(resync)])
    server, address = await serve(engine)
    router = Router()
    sub = KvEventSubscriber(address, router.on_batch, router.on_reset, backoff=FAST)
    sub.start()
    try:
        await until(lambda: len(router.received) == 6)
        await asyncio.sleep(0.1)  # nothing more arrives: batch 5 of the broken stream was never read
        assert router.received == [b.SerializeToString() for b in [*first[:3], *resync]]
        assert [r.start_sequence_number for r in engine.requests] == [0, 0]
        assert all(r.load_records_before_first_batch for r in engine.requests)
        assert router.resets == 2, "the router forgets the engine before each subscription"
        assert (sub.subscriptions, sub.resyncs, sub.last_reason) == (2, 1, "gap")
        assert router.last == 22
    finally:
        await sub.close()
        await server.stop(None)


async def test_stream_errors_resubscribe_with_growing_backoff():
    engine = Engine([Script([batch(1)], ABORT), Script([batch(1)], ABORT), Script([batch(7)])])
    server, address = await serve(engine)
    router = Router()
    sub = KvEventSubscriber(address, router.on_batch, router.on_reset, backoff=FAST)
    sub.start()
    try:
        await until(lambda: len(engine.requests) == 3 and router.last == 7)
        gaps = [b - a for a, b in zip(engine.started_at, engine.started_at[1:], strict=False)]
        assert gaps[0] >= 0.05 and gaps[1] >= 0.1, gaps
        assert sub.last_reason == "UNAVAILABLE"
        assert sub.publishes is True
    finally:
        await sub.close()
        await server.stop(None)


async def test_an_engine_restart_ends_the_stream_and_is_followed():
    engine = Engine([Script([batch(1), batch(2)], END), Script([batch(1)])])
    server, address = await serve(engine)
    router = Router()
    sub = KvEventSubscriber(address, router.on_batch, router.on_reset, backoff=FAST)
    sub.start()
    try:
        # The restarted engine numbers from 1 again: accepted because the router was reset.
        await until(lambda: len(router.received) == 3)
        assert router.last == 1 and router.resets == 2
        assert sub.last_reason == "stream ended"
    finally:
        await sub.close()
        await server.stop(None)


async def test_close_cancels_the_stream_and_stops_cleanly():
    engine = Engine([Script([batch(1)])])
    server, address = await serve(engine)
    router = Router()
    sub = KvEventSubscriber(address, router.on_batch, router.on_reset, backoff=FAST)
    sub.start()
    try:
        await until(lambda: len(router.received) == 1)
        await sub.close()
        await asyncio.wait_for(engine.cancelled.wait(), 5)
        await sub.close()  # idempotent
        sub.start()  # a closed subscriber stays closed
        await asyncio.sleep(0.2)
        assert len(engine.requests) == 1
    finally:
        await server.stop(None)


async def test_an_engine_without_events_is_retried_slowly():
    server, address = await serve(None)  # no VllmEngine service: UNIMPLEMENTED
    router = Router()
    sub = KvEventSubscriber(address, router.on_batch, router.on_reset, backoff=FAST)
    started = time.monotonic()
    sub.start()
    try:
        await until(lambda: sub.subscriptions == 2, within_s=3)
        assert time.monotonic() - started >= FAST.max_s, "no events: the longest backoff, not the first"
        assert sub.publishes is False
        assert sub.last_reason == "UNIMPLEMENTED"
    finally:
        await sub.close()
        await server.stop(None)


async def test_a_failing_handler_resubscribes_instead_of_dying():
    engine = Engine([Script([batch(1)]), Script([batch(2)])])
    server, address = await serve(engine)
    calls: list[bytes] = []

    def on_batch(address: str, data: bytes) -> str:
        calls.append(data)
        if len(calls) == 1:
            raise RuntimeError("router bug")
        return "applied"

    sub = KvEventSubscriber(address, on_batch, lambda a: None, backoff=FAST)
    sub.start()
    try:
        await until(lambda: len(calls) == 2)
        assert sub.subscriptions == 2
    finally:
        await sub.close()
        await server.stop(None)


async def test_subscriptions_follow_the_engine_set():
    engines = [Engine([Script([batch(1)])]), Engine([Script([batch(1)])])]
    served = [await serve(e) for e in engines]
    seen: list[str] = []
    subs = KvEventSubscriptions(lambda a, d: seen.append(a) or "applied", lambda a: None, backoff=FAST)
    try:
        for _, address in served:
            subs.add(address)
        subs.add(served[0][1])  # adding twice keeps one subscription
        await until(lambda: sorted(seen) == sorted(a for _, a in served))
        await subs.remove(served[0][1])
        assert served[0][1] not in subs and served[1][1] in subs
        await asyncio.wait_for(engines[0].cancelled.wait(), 5)
        assert len(engines[0].requests) == 1
    finally:
        await subs.close()
        for server, _ in served:
            await server.stop(None)


@pytest.mark.parametrize("attempt,expected", [(0, 0.05), (1, 0.1), (2, 0.2), (3, 0.4), (9, 0.4)])
def test_backoff_doubles_up_to_its_cap(attempt: int, expected: float):
    assert FAST.delay(attempt) == pytest.approx(expected)
