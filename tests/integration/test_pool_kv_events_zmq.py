"""Each engine's KV-event source, wired by the pool: an extproc server (the real `server.start`, pool and
native router, behind the real Envoy) serving three simulated vLLM engines, A with `kv_events =
"zmq://..."` (its ZMQ publisher with a replay socket), B with `"off"` and C with the default `"grpc"`.
Requests for a prompt A cached go to A (its ZMQ events reached the router); a prompt B holds whole does
not attract requests (B has no subscription on either channel); C's gRPC events steer as before. An
engine detected as SGLang with a ZMQ source falls back to SubscribeKvEvents.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from extproc import _native, server
from extproc.config import EngineConfig, ModelConfig, Settings
from extproc.envoy_bootstrap import EnvoyOptions, envoy_binary, render_bootstrap
from extproc.kv_events import NativeKvEventSubscriber
from extproc.kv_events_zmq import ZmqKvEventSubscriber
from extproc.models import default_model_dir
from extproc.pool import EnginePool
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.cluster import SimEngine
from tests.conftest import DEFAULT_MODEL, FreePorts, default_gateway
from tests.integration.harness import generate_direct, until, wait_ready

MODEL = DEFAULT_MODEL
BLOCK = 16
TOPIC = "kv-events"
OPTIONS = SimOptions(
    ttft_ms=0.5,
    itl_ms=0.2,
    block_size=BLOCK,
    kv_events_zmq="tcp://*:0",
    kv_events_zmq_replay="tcp://*:0",
    kv_events_zmq_topic=TOPIC,
)


def prompt(seed: int, blocks: int = 4) -> list[int]:
    """`blocks` full blocks of distinct tokens, no block shared with another seed's prompt."""
    return list(range(seed * 1000, seed * 1000 + blocks * BLOCK))


P, Q, R = prompt(1), prompt(2), prompt(3)


def zmq_source(engine: SimEngine) -> str:
    """The engine's `kv_events` setting: its PUB port, replay port and topic."""
    publisher = engine.kv_publisher
    assert publisher is not None and publisher.replay_endpoint is not None
    port, replay = publisher.endpoint.rpartition(":")[2], publisher.replay_endpoint.rpartition(":")[2]
    return f"zmq://127.0.0.1:{port}?replay={replay}&topic={TOPIC}"


def event_blocks(gateway: _native.Gateway) -> int:
    _, stats = gateway.routing_stats(MODEL)
    return int(stats.split("event_blocks: ")[1].split(",")[0])


@dataclass
class Gateway:
    cluster: SimCluster
    running: server.Running
    base_url: str

    @property
    def pool(self) -> EnginePool:
        return self.running.pool

    def engine(self, name: str) -> SimEngine:
        return self.cluster.engines["abc".index(name)]

    def complete(self, tokens: list[int]) -> str:
        """A completion through Envoy and extproc; answers the name of the engine that served it."""
        before = [e.stats.generate_requests for e in self.cluster.engines]
        body = json.dumps({"model": MODEL, "prompt": tokens, "max_tokens": 1}).encode()
        request = urllib.request.Request(
            f"{self.base_url}/v1/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
        served = [i for i, e in enumerate(self.cluster.engines) if e.stats.generate_requests > before[i]]
        assert len(served) == 1, served
        return "abc"[served[0]]


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    cluster = await start_engines(default_model_dir(), count=3, base_port=0, options=OPTIONS)
    a, b, c = cluster.engines
    engines = (
        EngineConfig(f"grpc://{a.address}", kv_events=zmq_source(a)),
        EngineConfig(f"grpc://{b.address}", kv_events="off"),
        EngineConfig(f"grpc://{c.address}"),  # the global default: SubscribeKvEvents
    )
    # Fresh engines priced apart (`fresh_cache_weight`) off: B publishes no events and the router never
    # sends it a request, so it would stay fresh and take any prompt; these tests read what the events say.
    settings = Settings(
        listen="127.0.0.1:0",
        models=(ModelConfig(name=MODEL, engines=engines),),
        routing_config='{"fresh_cache_weight": null}',
    )
    running = await server.start(settings, engine_wait_s=10)
    ports = FreePorts()
    port, admin_port = ports.one(), ports.one()
    config = tmp_path / "envoy.json"
    options = EnvoyOptions(listen_port=port, admin_port=admin_port, extproc_target=running.address)
    config.write_text(render_bootstrap(options))
    argv = [envoy_binary(), "-c", str(config), "--log-level", "warning", "--use-dynamic-base-id"]
    argv += ["--concurrency", "1"]
    envoy = await asyncio.to_thread(subprocess.Popen, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await asyncio.to_thread(wait_ready, f"http://127.0.0.1:{admin_port}", envoy)
        yield Gateway(cluster, running, f"http://127.0.0.1:{port}")
    finally:
        envoy.terminate()
        await asyncio.to_thread(envoy.wait, 10)
        await running.stop(grace=1)
        await cluster.stop(grace=None)


async def test_routing_follows_each_engines_chosen_kv_event_source(gateway: Gateway) -> None:
    a, b, c = (gateway.engine(n) for n in "abc")
    pool = gateway.pool
    await until(lambda: all(e.healthy for e in pool.engines))
    # One channel per engine, or none: A over ZMQ only, B nowhere, C over gRPC.
    await until(lambda: pool.kv_event_subscriber(c.address) is not None)
    zmq = pool.kv_event_subscriber(a.address)
    assert isinstance(zmq, ZmqKvEventSubscriber)
    assert isinstance(pool.kv_event_subscriber(c.address), NativeKvEventSubscriber)
    assert pool.kv_event_subscriber(b.address) is None
    await until(lambda: c.core.hub.subscribers == 1)
    assert (a.core.hub.subscribers, b.core.hub.subscribers) == (0, 0), "no SubscribeKvEvents for A or B"

    # ZMQ's slow joiner: A's SUB socket hears nothing until it is connected; a first message then replays
    # A's history from its replay socket, so whatever came before is not lost.
    seed = 100
    while not zmq.messages:
        await generate_direct(a, prompt(seed, blocks=1))
        seed += 1
        await asyncio.sleep(0.02)
    assert a.kv_publisher is not None
    await generate_direct(a, P)
    await generate_direct(a, Q[:BLOCK])  # A holds Q's first block ...
    await generate_direct(b, Q)  # ... B all of it, which the router must not hear of
    before = event_blocks(gateway.running.gateway)
    await generate_direct(c, R)
    last = a.kv_publisher.batches - 1
    await until(lambda: zmq.applied == last)
    await until(lambda: event_blocks(gateway.running.gateway) >= before + len(R) // BLOCK)

    for _ in range(3):
        assert await asyncio.to_thread(gateway.complete, P) == "a", "A's ZMQ events name it P's holder"
        assert await asyncio.to_thread(gateway.complete, Q) == "a", "B's stores never reached the router"
        assert await asyncio.to_thread(gateway.complete, R) == "c", "C's gRPC events name it R's holder"
    assert zmq.resets == 1 and zmq.last_reason is None, "one ZMQ subscription, never resynchronized"


async def test_an_engine_detected_as_sglang_falls_back_to_grpc() -> None:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, protocol="sglang")
    (engine,) = cluster.engines
    gateway = default_gateway(MODEL, policy="kv_events")
    config = EngineConfig(f"grpc://{engine.address}", kv_events="zmq://127.0.0.1:1")
    pool = EnginePool.create(gateway, MODEL, [config], load_interval_s=0)
    try:
        with structlog.testing.capture_logs() as logs:
            await pool.start(wait_s=5)
            await pool.check_all()  # a later health round warns no more
        assert isinstance(pool.kv_event_subscriber(engine.address), NativeKvEventSubscriber)
        await until(lambda: engine.core.hub.subscribers == 1)
        warnings = [e for e in logs if "ZMQ publisher but the engine speaks SGLang" in e["event"]]
        assert len(warnings) == 1 and warnings[0]["kv_events"] == "zmq://127.0.0.1:1"
    finally:
        await pool.close()
        await cluster.stop(grace=None)
