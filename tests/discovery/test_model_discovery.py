"""A model's discovered engines: sources merged, and what the engine pool does with the set."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from extproc.discovery.model_discovery import DiscoveredEngine, DiscoveryOptions, ModelDiscovery
from extproc.pool import EnginePool
from extproc.setting_parsers import EngineConfig
from tests.conftest import DEFAULT_MODEL, default_gateway


async def test_two_sources_naming_one_engine_give_it_once_ready_if_either_says_so() -> None:
    answers = {"a.test": ["10.0.0.1", "10.0.0.2"], "b.test": ["10.0.0.2", "10.0.0.3"]}
    applied: list[Mapping[str, DiscoveredEngine]] = []

    async def resolve(name: str, port: int) -> list[str]:
        return answers[name]

    async def apply(engines: Mapping[str, DiscoveredEngine]) -> None:
        applied.append(engines)

    sglang = EngineConfig("grpc://b.test:1", protocol="sglang")
    sources = [EngineConfig("grpc://a.test:1"), sglang]
    discovery = ModelDiscovery("m", sources, apply, DiscoveryOptions(0.01, resolve=resolve))
    discovery.start()
    try:
        for _ in range(100):
            if applied and len(applied[-1]) == 3:
                break
            await asyncio.sleep(0.01)
    finally:
        await discovery.close()
    engines = applied[-1]
    assert sorted(engines) == ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
    assert all(e.ready for e in engines.values())
    assert engines["10.0.0.3:1"].config == sglang, "each engine keeps its source's protocol"


async def test_a_discovered_engine_reaches_the_router_only_once_probed_and_configured_ones_stay() -> None:
    gateway = default_gateway()
    pool = EnginePool.create(gateway, DEFAULT_MODEL, ["grpc://127.0.0.1:1"], kv_events=False)
    try:
        found = {
            "127.0.0.1:1": DiscoveredEngine(EngineConfig("k8s://vllm"), ready=False),  # configured: untouched
            "127.0.0.1:2": DiscoveredEngine(EngineConfig("k8s://vllm"), ready=True),  # nothing listens there
        }
        await pool.set_discovered(found)
        await asyncio.sleep(0.3)  # its first probe fails
        static, discovered = pool.engines
        assert (static.address, static.discovered, static.draining) == ("127.0.0.1:1", False, False)
        assert (discovered.address, discovered.discovered, discovered.published) == (
            "127.0.0.1:2",
            True,
            False,
        )
        assert [e["engine"] for e in gateway.engines()] == ["127.0.0.1:1"], "unprobed: not routable"
        await pool.set_discovered({})
        assert [e.address for e in pool.engines] == ["127.0.0.1:1"]
    finally:
        await pool.close()


async def test_an_engine_removed_while_it_is_being_checked_leaves_the_health_loop_running() -> None:
    gateway = default_gateway()
    pool = EnginePool.create(gateway, DEFAULT_MODEL, [], kv_events=False)
    try:
        vllm = EngineConfig("k8s://vllm", protocol="vllm")
        await pool.set_discovered({"127.0.0.1:1": DiscoveredEngine(vllm, ready=True)})
        (engine,) = pool.engines
        engine.healthy = True  # as if its loads were being polled
        await pool.set_discovered({})  # its channel is closed
        # A check or load poll that was under way makes its next call on the closed channel: it ends
        # quietly instead of ending the health (or load) loop that awaits it.
        await pool._check(engine)
        await pool._poll_load(engine)
        assert pool.engines == [] and gateway.engines() == []
    finally:
        await pool.close()
