"""The simulator speaking SGLang's `sglang.grpc.scheduler.SglangScheduler` (`--protocol sglang`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines

PROMPT = list(range(3000, 3100))


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    options = SimOptions(ttft_ms=1, itl_ms=1)
    cluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=options, protocol="sglang"
    )
    yield cluster
    await cluster.stop(grace=None)


@pytest.fixture
async def channel(sim: SimCluster) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        yield channel


def request(*, stream: bool, request_id: str = "s", **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def test_stream_counts_are_cumulative(channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.SglangSchedulerStub(channel)
    whole = [m async for m in stub.Generate(request(stream=False, max_new_tokens=5, ignore_eos=True))]
    assert [m.WhichOneof("response") for m in whole] == ["complete"]
    assert len(whole[0].complete.output_ids) == whole[0].complete.completion_tokens == 5
    assert whole[0].request_id == "s" and whole[0].complete.cached_tokens == 0

    messages = [m async for m in stub.Generate(request(stream=True, max_new_tokens=5, ignore_eos=True))]
    *chunks, last = messages
    assert [m.chunk.completion_tokens for m in chunks] == [1, 2, 3, 4, 5]  # totals so far
    assert [t for m in chunks for t in m.chunk.token_ids] == list(whole[0].complete.output_ids)
    assert all(m.request_id == "s" for m in messages)
    assert last.complete.finish_reason == "length" and last.complete.completion_tokens == 5
    assert last.complete.cached_tokens == 96  # the first run cached (100 - 1) // 16 blocks


async def test_abort_by_request_id(channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.SglangSchedulerStub(channel)
    call = stub.Generate(request(stream=True, request_id="gone", max_new_tokens=5000, ignore_eos=True))
    await call.read()
    answer = await stub.Abort(pb.AbortRequest(request_id="gone"))
    assert answer.success
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    assert rest[-1].complete.finish_reason == "abort"


async def test_management_rpcs(sim: SimCluster, channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.SglangSchedulerStub(channel)
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.served_model_name == "llama3-default" and list(info.eos_token_ids) == [128001, 128009]
    server = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert server.server_type == "grpc" and server.sglang_version
    assert server.server_args["page_size"] == 16 and server.max_total_num_tokens == 4096 * 16
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert loads.dp_rank_count == 1 and loads.aggregate.total_reqs == 0
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks[-1].sha256
    health = health_pb2_grpc.HealthStub(channel)
    answer = await health.Check(
        health_pb2.HealthCheckRequest(service="sglang.grpc.scheduler.SglangScheduler")
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
