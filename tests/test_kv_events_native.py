"""The natively read KV-event subscriber (`NativeKvEventSubscriber`, `_native.KvSubscription`) against a
real grpc.aio engine streaming real `KvEventBatch` messages into a real router: what the router learns
(the blocks an engine holds, its load), and when the subscription starts over."""

from __future__ import annotations

import asyncio
import time

import pytest

from extproc import _native
from extproc.kv_events import NativeKvEventSubscriber, NativeKvEventSubscriptions
from tests.conftest import DEFAULT_MODEL, default_gateway
from tests.test_kv_events import ABORT, END, FAST, Engine, Script, batch, serve, until

MODEL = DEFAULT_MODEL


def routed(address: str) -> _native.Gateway:
    gateway = default_gateway(MODEL)
    gateway.set_endpoints(MODEL, [(address, 16)])
    return gateway


def engine_view(gateway: _native.Gateway, address: str) -> dict[str, str | int | float | bool]:
    return next(e for e in gateway.engines() if e["engine"] == address)


def subscriber(
    gateway: _native.Gateway, address: str, resets: list[str] | None = None
) -> NativeKvEventSubscriber:
    def on_reset(a: str) -> None:
        gateway.reset_kv_events(MODEL, a)
        if resets is not None:
            resets.append(a)

    return NativeKvEventSubscriber(address, gateway, MODEL, on_reset, backoff=FAST)


async def test_batches_reach_the_router_and_a_gap_resubscribes_from_zero():
    first = [batch(1), batch(2), batch(4), batch(5)]  # 3 is lost
    resync = [batch(20, snapshot=(0, 2)), batch(21, snapshot=(1, 2)), batch(22)]
    engine = Engine([Script(first), Script(resync)])
    server, address = await serve(engine)
    gateway = routed(address)
    resets: list[str] = []
    sub = subscriber(gateway, address, resets)
    sub.start()
    try:
        await until(lambda: engine_view(gateway, address)["running"] == 22)
        await asyncio.sleep(0.1)
        view = engine_view(gateway, address)
        assert view["cached_blocks"] == 3, "the gap cleared the engine; the snapshot's blocks count"
        assert [r.start_sequence_number for r in engine.requests] == [0, 0]
        assert all(r.load_records_before_first_batch for r in engine.requests)
        assert resets == [address, address], "the router forgets the engine before each subscription"
        assert (sub.subscriptions, sub.resyncs, sub.last_reason) == (2, 1, "gap")
        assert sub.batches == 6, "batch 5 of the broken stream was never read"
        assert sub.publishes is True
    finally:
        await sub.close()
        await server.stop(None)


async def test_stream_errors_resubscribe_with_growing_backoff():
    engine = Engine([Script([batch(1)], ABORT), Script([batch(1)], ABORT), Script([batch(7)])])
    server, address = await serve(engine)
    gateway = routed(address)
    sub = subscriber(gateway, address)
    sub.start()
    try:
        await until(lambda: len(engine.requests) == 3 and engine_view(gateway, address)["running"] == 7)
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
    gateway = routed(address)
    sub = subscriber(gateway, address)
    sub.start()
    try:
        # The restarted engine numbers from 1 again: accepted because the router was reset.
        await until(lambda: sub.batches == 3 and engine_view(gateway, address)["running"] == 1)
        assert engine_view(gateway, address)["cached_blocks"] == 1
        assert sub.last_reason == "stream ended"
    finally:
        await sub.close()
        await server.stop(None)


async def test_close_cancels_the_stream_and_stops_cleanly():
    engine = Engine([Script([batch(1)])])
    server, address = await serve(engine)
    sub = subscriber(routed(address), address)
    sub.start()
    try:
        await until(lambda: sub.batches == 1)
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
    sub = subscriber(routed(address), address)
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


async def test_an_engine_the_router_does_not_know_resubscribes():
    engine = Engine([Script([batch(1)]), Script([batch(1)])])
    server, address = await serve(engine)
    sub = subscriber(routed("10.0.0.9:9000"), address)
    sub.start()
    try:
        await until(lambda: len(engine.requests) == 2)
        assert sub.last_reason == "unknown_endpoint"
    finally:
        await sub.close()
        await server.stop(None)


async def test_an_unreachable_engine_is_unavailable():
    _, address = await serve(None)
    sub = subscriber(routed(address), "127.0.0.1:1")
    sub.start()
    try:
        await until(lambda: sub.resyncs >= 1)
        assert sub.last_reason == "UNAVAILABLE"
        assert sub.publishes is None
    finally:
        await sub.close()


async def test_subscriptions_follow_the_engine_set():
    engines = [Engine([Script([batch(1)])]), Engine([Script([batch(1)])])]
    served = [await serve(e) for e in engines]
    gateway = default_gateway(MODEL)
    gateway.set_endpoints(MODEL, [(a, 16) for _, a in served])
    subs = NativeKvEventSubscriptions(gateway, MODEL, lambda a: None, backoff=FAST)
    try:
        for _, address in served:
            subs.add(address)
        subs.add(served[0][1])  # adding twice keeps one subscription
        await until(lambda: all(engine_view(gateway, a)["running"] == 1 for _, a in served))
        await subs.remove(served[0][1])
        assert served[0][1] not in subs and served[1][1] in subs
        await asyncio.wait_for(engines[0].cancelled.wait(), 5)
        assert len(engines[0].requests) == 1
    finally:
        await subs.close()
        for server, _ in served:
            await server.stop(None)


def test_bad_arguments_are_refused_before_anything_starts():
    gateway = default_gateway(MODEL)
    with pytest.raises(ValueError, match="unknown model"):
        _native.KvSubscription(gateway, "nope", "127.0.0.1:1", lambda r: None)
    with pytest.raises(ValueError, match="tls_ca"):
        _native.KvSubscription(gateway, MODEL, "127.0.0.1:1", lambda r: None, tls_server_name="engine")
    with pytest.raises(OSError, match=r"/nonexistent/ca\.pem"):
        _native.KvSubscription(gateway, MODEL, "127.0.0.1:1", lambda r: None, tls_ca="/nonexistent/ca.pem")
