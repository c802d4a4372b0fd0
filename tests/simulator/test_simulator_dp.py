"""Data-parallel ranks in the simulated engines (`SimOptions.data_parallel_size`, `--data-parallel-size`):
one address, a scheduler and KV cache per rank, requests pinned by `data_parallel_rank` or balanced by
the engine, and per-rank loads and KV events. Real gRPC on loopback, both protocols where it matters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import grpc
import msgpack
import pytest
import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sg_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.__main__ import parse_args
from extproc.simulator.cluster import SimEngine
from extproc.simulator.command import simulator_argv
from extproc.simulator.metrics import render

Protocol = Literal["vllm", "sglang"]
BLOCK = 16
OPTIONS = SimOptions(ttft_ms=0.5, itl_ms=0.5, block_size=BLOCK, data_parallel_size=2)
# 100 tokens: a second run reads (100 - 1) // 16 = 6 blocks from the cache of the rank that ran the first.
PROMPT = [128000, *range(5000, 5099)]
OTHER = [128000, *range(7000, 7099)]
LONG = [128000, *range(9000, 9039)]
HIT = 6 * BLOCK


@dataclass
class Dp:
    """One engine with DP ranks and a channel to it."""

    cluster: SimCluster
    channel: grpc.aio.Channel

    @property
    def engine(self) -> SimEngine:
        return self.cluster.engines[0]

    @property
    def vllm(self) -> pb_grpc.VllmEngineStub:
        return pb_grpc.VllmEngineStub(self.channel)

    @property
    def sglang(self) -> sg_grpc.SglangSchedulerStub:
        return sg_grpc.SglangSchedulerStub(self.channel)


@asynccontextmanager
async def running(protocol: Protocol = "vllm", options: SimOptions = OPTIONS) -> AsyncIterator[Dp]:
    cluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=options, protocol=protocol
    )
    try:
        async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
            yield Dp(cluster, channel)
    finally:
        await cluster.stop(grace=None)


def vllm_request(
    prompt: list[int], *, rank: int | None, request_id: str = "r", stream: bool = False, max_tokens: int = 2
) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        stream=stream,
    )
    if rank is not None:  # set even for 0: the field is optional, presence is the pin
        request.data_parallel_rank = rank
    return request


def sglang_request(
    prompt: list[int], *, rank: int | None, request_id: str = "r", stream: bool = False, max_tokens: int = 2
) -> sg.GenerateRequest:
    request = sg.GenerateRequest(
        request_id=request_id,
        tokenized=sg.TokenizedInput(input_ids=prompt),
        sampling_params=sg.SamplingParams(max_new_tokens=max_tokens, ignore_eos=True),
        stream=stream,
    )
    if rank is not None:
        request.data_parallel_rank = rank
    return request


async def cached_tokens(
    dp: Dp, protocol: Protocol, prompt: list[int], rank: int | None, max_tokens: int = 2
) -> int:
    """A non-streamed request's `cached_tokens`: the prefix hit on the rank that served it."""
    if protocol == "vllm":
        request = vllm_request(prompt, rank=rank, max_tokens=max_tokens)
        messages = [m async for m in dp.vllm.Generate(request)]
    else:
        sglang = sglang_request(prompt, rank=rank, max_tokens=max_tokens)
        messages = [m async for m in dp.sglang.Generate(sglang)]
    assert [m.WhichOneof("response") for m in messages] == ["complete"]
    return messages[0].complete.cached_tokens


async def read_rest(call: Any) -> list[Any]:
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def start_long(dp: Dp, request_id: str, rank: int | None, prompt: list[int] = LONG) -> Any:
    """A vLLM stream that runs until aborted, once its first token is out (it is running then)."""
    call = dp.vllm.Generate(
        vllm_request(prompt, rank=rank, request_id=request_id, stream=True, max_tokens=5000)
    )
    assert (await call.read()).WhichOneof("response") == "chunk"
    return call


async def abort(dp: Dp, calls: dict[str, Any]) -> None:
    await dp.vllm.Abort(pb.AbortRequest(request_ids=list(calls)))
    for call in calls.values():
        assert (await read_rest(call))[-1].complete.finish_reason == "abort"


# --- pinning and balancing ------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
async def test_a_pinned_rank_has_its_own_cache(protocol: Protocol) -> None:
    async with running(protocol) as dp:
        assert await cached_tokens(dp, protocol, PROMPT, rank=1) == 0
        assert await cached_tokens(dp, protocol, PROMPT, rank=1) == HIT  # rank 1 cached it
        assert await cached_tokens(dp, protocol, PROMPT, rank=0) == 0  # rank 0's cache never saw it
        assert await cached_tokens(dp, protocol, PROMPT, rank=0) == HIT
        schedulers = dp.engine.core.schedulers
        assert [s.stats.prompt_tokens for s in schedulers] == [2 * len(PROMPT)] * 2


async def test_unpinned_requests_spread_over_ranks() -> None:
    async with running() as dp:
        calls = {"a": await start_long(dp, "a", None), "b": await start_long(dp, "b", None, OTHER)}
        loads = await dp.vllm.GetLoads(pb.GetLoadsRequest())
        assert loads.dp_rank_count == 2
        assert [(load.dp_rank, load.num_running_reqs) for load in loads.loads] == [(0, 1), (1, 1)]
        # With both ranks busy, a third one goes to the lowest rank; the abort finds each on its rank.
        calls["c"] = await start_long(dp, "c", None, PROMPT)
        loads = await dp.vllm.GetLoads(pb.GetLoadsRequest())
        assert [load.num_total_reqs for load in loads.loads] == [2, 1]
        await abort(dp, calls)
        assert dp.engine.stats.aborts == 3
        assert [len(s.running) + len(s.waiting) for s in dp.engine.core.schedulers] == [0, 0]


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
@pytest.mark.parametrize("rank", [2, -1])
async def test_a_rank_out_of_range_is_refused(protocol: Protocol, rank: int) -> None:
    async with running(protocol) as dp:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await cached_tokens(dp, protocol, PROMPT, rank=rank)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"data_parallel_rank {rank} is out of range [0, 2)" in (refused.value.details() or "")
        stats = dp.engine.stats
        assert (stats.generate_requests, stats.rejected, stats.active, stats.output_tokens) == (1, 1, 0, 0)


# --- management RPCs ------------------------------------------------------------------------------


async def test_vllm_server_info_and_loads_per_rank() -> None:
    async with running() as dp:
        server = await dp.vllm.GetServerInfo(pb.GetServerInfoRequest())
        assert server.data_parallel_size == 2
        calls = {"busy": await start_long(dp, "busy", 1)}
        loads = await dp.vllm.GetLoads(pb.GetLoadsRequest())
        assert [(load.dp_rank, load.num_running_reqs) for load in loads.loads] == [(0, 0), (1, 1)]
        assert loads.loads[1].token_usage > 0 and loads.loads[0].token_usage == 0
        only = await dp.vllm.GetLoads(pb.GetLoadsRequest(dp_rank=1))
        assert only.dp_rank_count == 2 and [load.dp_rank for load in only.loads] == [1]
        assert only.loads[0].num_running_reqs == 1
        zero = await dp.vllm.GetLoads(pb.GetLoadsRequest(dp_rank=0))  # 0 set is a filter too
        assert [(load.dp_rank, load.num_running_reqs) for load in zero.loads] == [(0, 0)]
        assert not (await dp.vllm.GetLoads(pb.GetLoadsRequest(dp_rank=5))).loads
        await abort(dp, calls)


async def test_sglang_server_info_and_loads_per_rank() -> None:
    async with running("sglang") as dp:
        server = await dp.sglang.GetServerInfo(sg.GetServerInfoRequest())
        assert server.server_args["dp_size"] == 2
        call = dp.sglang.Generate(
            sglang_request(LONG, rank=1, request_id="busy", stream=True, max_tokens=5000)
        )
        await call.read()
        loads = await dp.sglang.GetLoads(sg.GetLoadsRequest())
        assert loads.dp_rank_count == 2
        assert [(load.dp_rank, load.num_running_reqs) for load in loads.loads] == [(0, 0), (1, 1)]
        assert (loads.aggregate.total_running_reqs, loads.aggregate.total_reqs) == (1, 1)
        assert loads.aggregate.avg_token_usage == pytest.approx(loads.loads[1].token_usage / 2)
        only = await dp.sglang.GetLoads(sg.GetLoadsRequest(dp_rank=1))
        assert [load.dp_rank for load in only.loads] == [1] and only.aggregate.total_running_reqs == 1
        assert only.aggregate.avg_token_usage == pytest.approx(only.loads[0].token_usage)
        assert (await dp.sglang.Abort(sg.AbortRequest(request_id="busy"))).success
        assert (await read_rest(call))[-1].complete.finish_reason == "abort"


async def test_flush_cache_flushes_every_rank_or_none() -> None:
    async with running() as dp:
        for rank in (0, 1):
            await cached_tokens(dp, "vllm", PROMPT, rank)
        calls = {"busy": await start_long(dp, "busy", 1)}
        refused = await dp.vllm.FlushCache(common_pb2.FlushCacheRequest())
        assert not refused.success  # rank 1 holds blocks: no rank is flushed
        assert await cached_tokens(dp, "vllm", PROMPT, rank=0) == HIT
        await abort(dp, calls)
        assert (await dp.vllm.FlushCache(common_pb2.FlushCacheRequest())).success
        assert [await cached_tokens(dp, "vllm", PROMPT, rank) for rank in (0, 1)] == [0, 0]


async def test_metrics_total_the_ranks() -> None:
    async with running() as dp:
        for rank in (0, 1):
            await cached_tokens(dp, "vllm", PROMPT, rank)
        calls = {"busy": await start_long(dp, "busy", 1)}
        text = render(dp.engine.core)
        busy_usage = dp.engine.core.schedulers[1].cache.usage  # read in the same step as the render
        await abort(dp, calls)
    values = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if line[0] != "#"}
    assert values["vllm:prompt_tokens_total"] == str(2 * len(PROMPT) + len(LONG))
    assert values["vllm:num_requests_running"] == "1"
    assert values["vllm:time_to_first_token_seconds_count"] == "3"
    # Rank 1's held blocks over both ranks' blocks: half its own usage.
    assert busy_usage > 0 and float(values["vllm:kv_cache_usage_perc"]) == pytest.approx(busy_usage / 2)


# --- KV events ------------------------------------------------------------------------------------


def stored_tokens(batch: common_pb2.KvEventBatch) -> list[int]:
    return [
        token
        for event in batch.events
        if event.WhichOneof("data") == "stored"
        for block in event.stored.blocks
        for token in block.token_ids
    ]


async def test_kv_events_carry_each_ranks_batches() -> None:
    async with running(options=replace(OPTIONS, itl_ms=2)) as dp:
        batches: list[common_pb2.KvEventBatch] = []
        stream = dp.vllm.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        await stream.initial_metadata()

        async def read() -> None:
            async for batch in stream:
                batches.append(batch)

        reader = asyncio.ensure_future(read())

        def events(rank: int) -> list[common_pb2.KvEventBatch]:
            return [b for b in batches if b.dp_rank == rank and not b.load.load_only]

        # Rank 1 decodes on (a batch per filled block), rank 0 serves one short request meanwhile.
        calls = {"long": await start_long(dp, "long", 1, PROMPT)}
        # One token: its blocks are published once it finished, so rank 0's record shows it gone.
        await cached_tokens(dp, "vllm", OTHER, rank=0, max_tokens=1)
        await eventually(lambda: len(events(0)) >= 1 and len(events(1)) >= 3)
        # Rank 0 gets heartbeats of its own although rank 1's batches keep the stream busy.
        await eventually(lambda: any(b.load.load_only and b.dp_rank == 0 for b in batches))
        snapshot = list(batches)
        await abort(dp, calls)
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    assert all(b.HasField("dp_rank") and b.dp_rank in (0, 1) for b in snapshot)
    by_rank = {rank: [b for b in snapshot if b.dp_rank == rank and not b.load.load_only] for rank in (0, 1)}
    for rank, own in by_rank.items():
        # Each rank numbers its own batches from 0; each batch's load record is its rank's.
        assert [b.sequence_number for b in own] == list(range(len(own))), rank
        assert {b.load.running_requests for b in own} == {rank}, rank  # only rank 1 runs one
    rank0_tokens = [t for b in by_rank[0] for t in stored_tokens(b)]
    rank1_tokens = [t for b in by_rank[1] for t in stored_tokens(b)]
    assert rank1_tokens[: 6 * BLOCK] == PROMPT[: 6 * BLOCK]  # the pinned request's blocks, on rank 1
    assert rank0_tokens == OTHER[: 6 * BLOCK]  # and none of them on rank 0


async def test_each_rank_publishes_on_its_own_zmq_endpoint(tmp_path: Path) -> None:
    options = replace(
        OPTIONS,
        kv_events_zmq=f"ipc://{tmp_path}/kv-{{i}}.ipc",
        kv_events_zmq_replay=f"ipc://{tmp_path}/replay-{{i}}.ipc",
    )
    cluster = await start_engines(default_model_dir(), count=2, base_port=0, options=options)
    try:
        endpoints = [[p.endpoint for p in e.kv_publishers] for e in cluster.engines]
        assert endpoints == [
            [f"ipc://{tmp_path}/kv-{slot}.ipc" for slot in pair] for pair in ((0, 1), (2, 3))
        ]
        first = cluster.engines[0]
        async with grpc.aio.insecure_channel(first.address) as channel:
            dp = Dp(cluster, channel)
            await cached_tokens(dp, "vllm", PROMPT, rank=1)
        rank0, rank1 = first.kv_publishers
        assert (rank0.batches, rank1.batches) == (0, 1)
        assert rank1.replay_endpoint == f"ipc://{tmp_path}/replay-1.ipc"
        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.connect(rank1.replay_endpoint)
        try:
            await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
            assert await dealer.poll(5000)
            _, _, sequence, payload = await dealer.recv_multipart()
        finally:
            dealer.close(linger=0)
    finally:
        await cluster.stop(grace=None)
    _, events, dp_rank = msgpack.unpackb(payload)
    assert int.from_bytes(sequence, "big") == 0 and dp_rank == 1
    assert events[0]["type"] == "BlockStored" and events[0]["token_ids"] == PROMPT[: 6 * BLOCK]


# --- command line ---------------------------------------------------------------------------------


def test_the_command_line_carries_the_size() -> None:
    options = SimOptions(data_parallel_size=4, num_blocks=512)
    argv = simulator_argv(options, engines=2)
    assert "--data-parallel-size" in argv
    assert parse_args(argv[3:]).options == options
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--data-parallel-size", "0"])
    with pytest.raises(SystemExit):  # two ranks need two endpoints
        parse_args(["--port", "0", "--data-parallel-size", "2", "--kv-events-zmq", "ipc:///tmp/kv.ipc"])
    with pytest.raises(ValueError, match="data_parallel_size"):
        SimOptions(data_parallel_size=0)
