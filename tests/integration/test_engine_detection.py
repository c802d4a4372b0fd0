"""Engine protocol detection at registration: real simulated engines of each protocol over gRPC sockets,
an engine that speaks neither, and a configured protocol the engine does not serve."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc import _native
from extproc.config import EngineConfig
from extproc.models import default_model_dir
from extproc.pool import EnginePool
from extproc.simulator import SimOptions, start_engines
from tests.conftest import FreePorts, default_gateway
from tests.integration.harness import DirectCalls, local_stack, until

MODEL = "m"


@pytest.fixture
def gateway() -> _native.Gateway:
    gw = default_gateway(MODEL)
    return gw


@pytest.fixture
async def health_only_engine() -> AsyncIterator[str]:
    """A gRPC server that answers only the standard health service: neither vLLM nor SGLang."""
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.fixture
def logs() -> Iterator[list[dict[str, object]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
async def test_each_protocol_is_detected_and_registered(
    gateway: _native.Gateway, protocol: str, logs: list[dict[str, object]]
) -> None:
    # A block size other than the default shows it was read from the engine (SGLang: page_size).
    options = SimOptions(block_size=32, max_model_len=4096)
    cluster = await start_engines(
        default_model_dir(), count=2, base_port=0, options=options, protocol=protocol
    )  # type: ignore[arg-type]
    pool = EnginePool.create(gateway, MODEL, [f"grpc://{a}" for a in cluster.addresses], load_interval_s=0)
    try:
        await pool.start(wait_s=10)
        assert [e.protocol for e in pool.engines] == [protocol, protocol]
        assert all(e.healthy for e in pool.engines)
        assert [e.block_size for e in pool.engines] == [32, 32]
        assert sorted(gateway.endpoints(MODEL)) == sorted(cluster.addresses)
        assert gateway.max_context(MODEL) == 4096
        detected = [entry for entry in logs if entry["event"] == "engine protocol detected"]
        assert sorted(str(entry["engine"]) for entry in detected) == sorted(cluster.addresses)
        assert {entry["protocol"] for entry in detected} == {protocol}
        # Its KV events arrive through its own service's SubscribeKvEvents once it does some work.
        subscriptions = pool._subscriptions
        assert subscriptions is not None
        subscriber = subscriptions.get(cluster.addresses[0])
        assert subscriber is not None
        direct = DirectCalls(cluster.engines[0])
        direct.start(1, prompt_len=100, max_tokens=3)
        async for _ in direct.calls[0]:
            pass
        await until(lambda: subscriber.batches > 0)
        assert subscriber.publishes
        await direct.close()
    finally:
        await pool.close()
        await cluster.stop(grace=0)


async def test_an_engine_speaking_neither_protocol_stays_out_with_a_clear_log(
    gateway: _native.Gateway, health_only_engine: str, logs: list[dict[str, object]]
) -> None:
    pool = EnginePool.create(gateway, MODEL, [f"grpc://{health_only_engine}"], load_interval_s=0)
    try:
        await pool.start(wait_s=0)
        await pool.check_all()  # a second round: still out, and the reason is not logged again
        assert not pool.engines[0].healthy and pool.engines[0].protocol is None
        assert gateway.endpoints(MODEL) == []
        warnings = [e for e in logs if e["event"] == "engine not usable"]
        assert len(warnings) == 1, warnings
        assert warnings[0]["engine"] == health_only_engine
        assert "speaks neither vLLM nor SGLang" in str(warnings[0]["reason"])
    finally:
        await pool.close()


async def test_a_configured_protocol_the_engine_does_not_serve(
    gateway: _native.Gateway, logs: list[dict[str, object]]
) -> None:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, protocol="vllm")
    engine = EngineConfig(f"grpc://{cluster.addresses[0]}", "sglang")
    pool = EnginePool.create(gateway, MODEL, [engine], load_interval_s=0)
    try:
        await pool.start(wait_s=0)
        assert not pool.engines[0].healthy
        assert gateway.endpoints(MODEL) == []
        reasons = [str(e["reason"]) for e in logs if e["event"] == "engine not usable"]
        assert reasons == ["does not implement the sglang protocol"]
    finally:
        await pool.close()
        await cluster.stop(grace=0)


def test_the_sglang_test_stack_is_detected_as_sglang(tmp_path: Path) -> None:
    with local_stack(FreePorts(), tmp_path, protocol="sglang") as stack:
        assert [e.protocol for e in stack.engines.engines] == ["sglang", "sglang"]
        assert [e.protocol for e in stack.gateway.pool.engines] == ["sglang", "sglang"]
        assert sorted(stack.gateway.gateway.endpoints(stack.model)) == sorted(stack.engines.addresses)
        with urllib.request.urlopen(f"{stack.base_url}/v1/models", timeout=10) as resp:
            listed = json.loads(resp.read())
        assert [m["id"] for m in listed["data"]] == [stack.model]


async def test_an_engine_restarted_with_the_other_protocol_is_detected_again(
    gateway: _native.Gateway,
) -> None:
    port = FreePorts().one()
    first = await start_engines(default_model_dir(), count=1, base_port=port, protocol="vllm")
    pool = EnginePool.create(gateway, MODEL, [f"grpc://127.0.0.1:{port}"], load_interval_s=0)
    second = None
    try:
        await pool.start(wait_s=10)
        assert pool.engines[0].protocol == "vllm" and pool.engines[0].healthy
        await first.stop(grace=0)
        second = await start_engines(default_model_dir(), count=1, base_port=port, protocol="sglang")
        # A few health rounds: UNIMPLEMENTED under vLLM's name takes it out, the next one detects SGLang.
        for _ in range(20):
            await pool.check_all()
            if pool.engines[0].healthy:
                break
            await asyncio.sleep(0.1)
        assert pool.engines[0].protocol == "sglang" and pool.engines[0].healthy
        assert gateway.endpoints(MODEL) == [f"127.0.0.1:{port}"]
    finally:
        await pool.close()
        if second is not None:
            await second.stop(grace=0)


async def test_an_unreachable_engine_is_logged_once_until_it_comes_back(
    gateway: _native.Gateway, logs: list[dict[str, object]]
) -> None:
    port = FreePorts().one()
    pool = EnginePool.create(gateway, MODEL, [f"grpc://127.0.0.1:{port}"], load_interval_s=0)
    cluster = None
    try:
        await pool.start(wait_s=0)
        await pool.check_all()
        reasons = [str(e["reason"]) for e in logs if e["event"] == "engine not usable"]
        assert reasons == ["health check failed: UNAVAILABLE"]
        cluster = await start_engines(default_model_dir(), count=1, base_port=port, protocol="sglang")
        for _ in range(50):  # the channel reconnects after its backoff
            await pool.check_all()
            if pool.engines[0].healthy:
                break
            await asyncio.sleep(0.2)
        assert pool.engines[0].healthy and pool.engines[0].protocol == "sglang"
        assert any(e["event"] == "engine ready" for e in logs)
    finally:
        await pool.close()
        if cluster is not None:
            await cluster.stop(grace=0)
