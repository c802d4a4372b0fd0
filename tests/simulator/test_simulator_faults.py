"""Faults on demand and the engine's HTTP side (/faults, /metrics), over real gRPC and HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimEngine, SimOptions, start_engines

FAST = SimOptions(ttft_ms=1, itl_ms=1)


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    cluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=FAST, metrics_base_port=0
    )
    yield cluster
    await cluster.stop(grace=None)


@pytest.fixture
def engine(sim: SimCluster) -> SimEngine:
    return sim.engines[0]


@pytest.fixture
async def stub(sim: SimCluster) -> AsyncIterator[pb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        yield pb_grpc.VllmEngineStub(channel)


def request(**sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="f",
        tokenized=pb.TokenizedInput(input_ids=[128000, 9906, 1917]),
        sampling_params=pb.SamplingParams(**sampling),
        stream=True,
    )


async def http(engine: SimEngine, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    def call() -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{engine.metrics_port}{path}", data=data, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(call)


async def test_fail_with_a_chosen_status_a_number_of_times(
    engine: SimEngine, stub: pb_grpc.VllmEngineStub
) -> None:
    engine.faults.set(fail_code="RESOURCE_EXHAUSTED", fail_message="queue full", fail_count=2)
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            async for _ in stub.Generate(request(max_tokens=3)):
                pass
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert failure.value.details() == "queue full"
    messages = [m async for m in stub.Generate(request(max_tokens=3))]  # the third is served
    assert messages[-1].complete.finish_reason == "length"
    assert engine.stats.faults == 2 and engine.stats.completed == 1


async def test_die_mid_stream(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    engine.faults.set(die_after_tokens=4)
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        async for message in stub.Generate(request(max_tokens=50, ignore_eos=True)):
            received.append(message)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    # The engine wrote 4 chunks before dying; gRPC may drop some of them when the stream is torn down.
    assert 1 <= len(received) <= 4 and all(m.WhichOneof("response") == "chunk" for m in received)
    assert engine.core.scheduler.cache.used_blocks == 0  # the dead stream's blocks are freed
    assert (engine.stats.faults, engine.stats.cancelled, engine.stats.active) == (1, 0, 0)


async def test_stall_freezes_streams_until_cleared(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    call = stub.Generate(request(max_tokens=20, ignore_eos=True))
    await call.read()
    engine.faults.set(stall=True)
    await asyncio.sleep(0.05)
    produced = engine.stats.output_tokens
    await asyncio.sleep(0.2)
    assert engine.stats.output_tokens == produced  # nothing generated while stalled
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
    engine.faults.set(stall=False)
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    assert rest[-1].complete.finish_reason == "length"


async def test_slow_stretches_every_step(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    engine.faults.set(slow=20.0)  # 1 ms steps become 20 ms
    started = time.perf_counter()
    async for _ in stub.Generate(request(max_tokens=6, ignore_eos=True)):
        pass
    assert time.perf_counter() - started >= 0.1


async def test_unhealthy_and_refuse(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    engine.faults.set(unhealthy=True)
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert not health.healthy and health.message == "Engine is not alive"
    engine.faults.set(unhealthy=False, refuse=True)
    await engine.settled()
    async with grpc.aio.insecure_channel(engine.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await pb_grpc.VllmEngineStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=1)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    engine.faults.set(refuse=False)
    await engine.settled()
    # wait_for_ready: the refused connection left gRPC's shared subchannel in reconnect backoff.
    health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=10, wait_for_ready=True)
    assert health.healthy


def prompt_request(request_id: str, prompt: list[int], **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=True,
    )


async def first_chunk_cached(stub: pb_grpc.VllmEngineStub, request_id: str, prompt: list[int]) -> int:
    messages = [m async for m in stub.Generate(prompt_request(request_id, prompt, max_tokens=2))]
    return messages[0].chunk.cached_tokens


async def test_restart_cuts_every_call_and_comes_back_cold(
    engine: SimEngine, stub: pb_grpc.VllmEngineStub
) -> None:
    prompt = [128000] + [9906 + i for i in range(47)]  # 48 tokens: three full blocks of 16
    assert await first_chunk_cached(stub, "warm", prompt) == 0
    assert await first_chunk_cached(stub, "hit", prompt) == 32  # the last block is always computed
    events = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
    engine.faults.set(slow=50.0)  # 50 ms steps: the stream below is still running at the restart
    long_call = stub.Generate(prompt_request("long", [128000, 9906], max_tokens=500, ignore_eos=True))
    await long_call.read()
    restart = asyncio.create_task(engine.restart(down_s=2.0))
    # The cut stream ends in an error, never a clean finish, and so does the event subscription.
    with pytest.raises(grpc.aio.AioRpcError):
        while await long_call.read() is not grpc.aio.EOF:
            pass
    with pytest.raises(grpc.aio.AioRpcError):
        while await events.read() is not grpc.aio.EOF:
            pass
    # While it is down the port refuses connections.
    async with grpc.aio.insecure_channel(engine.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.VllmEngineStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and not restart.done()
    await restart
    engine.faults.clear()
    assert engine.restarts == 1 and engine.stats.active == 0
    async with grpc.aio.insecure_channel(engine.address) as channel:
        back = pb_grpc.VllmEngineStub(channel)
        await back.HealthCheck(pb.HealthCheckRequest(), timeout=10, wait_for_ready=True)
        events = back.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        # Cold: the prompt it held before is computed anew, and its first batch after is numbered 0.
        assert await first_chunk_cached(back, "cold", prompt) == 0
        batch = await events.read()
        assert batch.sequence_number == 0 and batch.events[0].WhichOneof("data") == "stored"
        events.cancel()


async def test_restart_over_http(engine: SimEngine) -> None:
    status, body = await http(engine, "POST", "/restart", {"down_s": 0.1})
    assert status == 200 and json.loads(body) == {"restarted": True, "down_s": 0.1}
    assert engine.restarts == 1
    for bad in ({"down_s": -1}, {"down_s": "soon"}, [1]):
        status, body = await http(engine, "POST", "/restart", bad)
        assert status == 400, body
    assert engine.restarts == 1


async def test_faults_over_http(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    status, body = await http(engine, "POST", "/faults", {"fail_code": "unavailable"})
    assert status == 200 and json.loads(body)["fail_code"] == "unavailable"
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        async for _ in stub.Generate(request(max_tokens=2)):
            pass
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    status, body = await http(engine, "DELETE", "/faults")
    assert status == 200 and json.loads(body)["fail_code"] is None
    status, body = await http(engine, "POST", "/faults", {"no_such_fault": 1})
    assert status == 400 and "no_such_fault" in body
    status, _ = await http(engine, "POST", "/faults", {"fail_code": "NOT_A_CODE"})
    assert status == 400


async def test_metrics_use_vllm_names(engine: SimEngine, stub: pb_grpc.VllmEngineStub) -> None:
    prompt = list(range(5000, 5100))
    for _ in range(2):
        async for _ in stub.Generate(
            pb.GenerateRequest(
                request_id="m",
                tokenized=pb.TokenizedInput(input_ids=prompt),
                sampling_params=pb.SamplingParams(max_tokens=3, ignore_eos=True),
            )
        ):
            pass
    status, text = await http(engine, "GET", "/metrics")
    assert status == 200

    def value(name: str) -> float:
        match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
        assert match, name
        return float(match.group(1))

    assert value("vllm:num_requests_running") == 0 and value("vllm:num_requests_waiting") == 0
    assert value("vllm:kv_cache_usage_perc") == 0
    assert value("vllm:prefix_cache_queries_total") == 200
    assert value("vllm:prefix_cache_hits_total") == 96  # the repeat hit (100 - 1) // 16 blocks
    assert value("vllm:generation_tokens_total") == 6
    assert (
        'vllm:request_success_total{engine="0",model_name="llama3-default",finished_reason="length"} 2'
        in text
    )
    assert value("vllm:time_to_first_token_seconds_count") == 2
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
