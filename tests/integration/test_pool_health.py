"""The pool's health checks against real simulated engines over gRPC sockets: a slow answer is not a dead
engine. One timed-out check is asked again before the engine leaves rotation (a busy engine, one warming
up after a restart, or a check that outlived a short outage by less than a reconnect, kept every request
out: the restart lifecycle test saw both); an engine slow every time, or gone, still leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from extproc import _native
from extproc import pool as pool_module
from extproc.kv_events import Backoff
from extproc.models import default_model_dir
from extproc.pool import HEALTH_TIMEOUT_S, UNHEALTHY_INTERVAL_S, EnginePool
from extproc.simulator import SimCluster, start_engines
from tests.conftest import default_gateway
from tests.integration.harness import until

MODEL = "m"


@pytest.fixture
async def one_engine() -> AsyncIterator[tuple[SimCluster, _native.Gateway, EnginePool]]:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0)
    gateway = default_gateway(MODEL)
    pool = EnginePool.create(gateway, MODEL, [f"grpc://{cluster.addresses[0]}"], load_interval_s=0)
    try:
        await pool.start(wait_s=10)
        assert pool.engines[0].healthy
        yield cluster, gateway, pool
    finally:
        await pool.close()
        await cluster.stop(grace=0)


def routable(gateway: _native.Gateway) -> list[bool]:
    return [bool(e["healthy"]) for e in gateway.engines() if e["model"] == MODEL]


async def test_one_slow_health_answer_keeps_the_engine_in_rotation(
    one_engine: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    cluster, gateway, pool = one_engine
    cluster.engines[0].faults.set(health_delay_s=HEALTH_TIMEOUT_S + 0.5, health_delay_count=1)
    await pool.check_all()
    assert cluster.engines[0].faults.settings.health_delay_count == 0  # the slow answer was met
    assert pool.engines[0].healthy and pool.engines[0].problem is None
    assert routable(gateway) == [True]


async def test_an_engine_slow_on_every_check_leaves_rotation(
    one_engine: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    cluster, gateway, pool = one_engine
    cluster.engines[0].faults.set(health_delay_s=HEALTH_TIMEOUT_S + 0.5)
    await pool.check_all()
    assert not pool.engines[0].healthy
    assert pool.engines[0].problem == "health check failed: DEADLINE_EXCEEDED"
    assert routable(gateway) == [False]
    cluster.engines[0].faults.clear()
    await pool.check_all()
    assert routable(gateway) == [True]


async def test_a_stopped_engine_leaves_rotation_within_one_check_round(
    one_engine: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    cluster, gateway, pool = one_engine
    await cluster.stop(grace=0)
    await pool.check_all()
    assert not pool.engines[0].healthy
    assert routable(gateway) == [False]


async def test_a_check_that_outlives_a_short_outage_keeps_the_engine(
    one_engine: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    # The engine stops; a check begins and times out while it is down; the engine is back on the same
    # port just after. The check asked again meets it (the channel reconnects within 300 ms), so the
    # engine never leaves rotation for an outage shorter than a check.
    cluster, gateway, pool = one_engine
    port = int(cluster.addresses[0].rsplit(":", 1)[1])
    await cluster.stop(grace=0)
    check = asyncio.create_task(pool.check_all())
    await asyncio.sleep(HEALTH_TIMEOUT_S * 1.1)  # past the first attempt's deadline
    back = await start_engines(default_model_dir(), count=1, base_port=port)
    try:
        await check
        assert pool.engines[0].healthy, pool.engines[0].problem
        assert routable(gateway) == [True]
    finally:
        await back.stop(grace=0)


@pytest.fixture
async def rare_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[SimCluster, _native.Gateway, EnginePool]]:
    """One engine whose pool's full health rounds are a minute apart: whatever takes it out of rotation or
    brings it back within the tests below is the checks that do not wait for a round."""
    monkeypatch.setattr(pool_module, "HEALTH_INTERVAL_S", 60.0)
    cluster = await start_engines(default_model_dir(), count=1, base_port=0)
    gateway = default_gateway(MODEL)
    pool = EnginePool.create(gateway, MODEL, [f"grpc://{cluster.addresses[0]}"], load_interval_s=0)
    try:
        await pool.start(wait_s=10)
        yield cluster, gateway, pool
    finally:
        await pool.close()
        await cluster.stop(grace=0)


async def test_an_engine_back_from_an_outage_is_in_rotation_within_the_unhealthy_interval(
    rare_rounds: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    cluster, gateway, pool = rare_rounds
    engine = cluster.engines[0]
    engine.faults.set(refuse=True)
    await engine.settled()
    await pool.check_all()
    assert routable(gateway) == [False]
    engine.faults.set(refuse=False)
    await engine.settled()
    # A check at most UNHEALTHY_INTERVAL_S away, a reconnect of at most 250 ms, and registering again.
    await until(lambda: routable(gateway) == [True], UNHEALTHY_INTERVAL_S + 1.0)


async def test_an_engine_whose_kv_event_stream_ends_is_checked_at_once(
    rare_rounds: tuple[SimCluster, _native.Gateway, EnginePool],
) -> None:
    cluster, gateway, pool = rare_rounds
    subscriber = pool.kv_event_subscriber(cluster.addresses[0])
    assert subscriber is not None
    await until(lambda: subscriber.subscriptions == 1, 5.0)
    restart = asyncio.create_task(cluster.engines[0].restart(2.0))
    # The stream's end starts the next subscription 0.1 s later (its first backoff), and with it a check.
    await until(lambda: routable(gateway) == [False], 1.0)
    await restart
    assert not pool.engines[0].healthy
    await until(lambda: routable(gateway) == [True], UNHEALTHY_INTERVAL_S + 1.0)


async def test_an_engine_back_in_rotation_is_subscribed_to_at_once(
    rare_rounds: tuple[SimCluster, _native.Gateway, EnginePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its subscription does not wait out the backoff it was in (made 30 s here after the first retry):
    without its KV events the router would send it requests blind to what it caches."""
    cluster, gateway, pool = rare_rounds
    monkeypatch.setattr(Backoff, "delay", lambda self, attempt: 0.1 if attempt == 0 else 30.0)
    subscriber = pool.kv_event_subscriber(cluster.addresses[0])
    assert subscriber is not None
    await until(lambda: subscriber.subscriptions == 1, 5.0)
    await cluster.engines[0].restart(1.0)  # the retry 0.1 s after the stream ended was refused
    assert subscriber.subscriptions == 2
    await until(lambda: routable(gateway) == [True], UNHEALTHY_INTERVAL_S + 1.0)
    await until(lambda: subscriber.subscriptions == 3, 0.5)
    await asyncio.sleep(0.5)
    assert subscriber.subscriptions == 3, subscriber.last_reason  # and it holds
