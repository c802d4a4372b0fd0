"""Streamed chunking and timing switched at run time: `tokens_per_message` merges a stream's tokens into
messages of that many (the last may be shorter) with the same output and logprobs, and HTTP /timing
changes step times and chunking for requests from then on, as the benchmark does per workload."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimEngine, SimOptions, start_engines
from extproc.simulator.__main__ import parse_args
from extproc.simulator.command import simulator_argv

PROMPT = [128000, 9906, 1917]


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    options = SimOptions(ttft_ms=0.5, itl_ms=0.2, decode_ms_per_seq=0)
    cluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=options, metrics_base_port=0
    )
    yield cluster
    await cluster.stop(grace=None)


async def stream(address: str, max_tokens: int, **sampling: object) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(
        request_id="t",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=3, **sampling),
        stream=True,
    )
    async with grpc.aio.insecure_channel(address) as channel:
        return [m async for m in pb_grpc.VllmEngineStub(channel).Generate(request)]


def chunks(messages: list[pb.GenerateResponse]) -> list[list[int]]:
    return [list(m.chunk.token_ids) for m in messages if m.WhichOneof("response") == "chunk"]


def flat(lists: list[list[int]]) -> list[int]:
    return [x for part in lists for x in part]


async def http(engine: SimEngine, method: str, body: object = None) -> tuple[int, dict[str, float]]:
    def call() -> tuple[int, dict[str, float]]:
        data = json.dumps(body).encode() if body is not None else None
        url = f"http://127.0.0.1:{engine.metrics_port}/timing"
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, data=data, method=method), timeout=5
            ) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    return await asyncio.to_thread(call)


async def test_tokens_per_message_merges_a_stream_into_messages_of_that_many(sim: SimCluster) -> None:
    one = await stream(sim.addresses[0], 10, logprobs=1)
    assert [len(c) for c in chunks(one)] == [1] * 10
    sim.engines[0].core.retime(tokens_per_message=4)
    four = await stream(sim.addresses[0], 10, logprobs=1)
    assert [len(c) for c in chunks(four)] == [4, 4, 2]
    # The same tokens and logprobs, only grouped differently; the complete repeats the last message.
    assert flat(chunks(four)) == flat(chunks(one))

    def logprob_ids(messages: list[pb.GenerateResponse]) -> list[int]:
        return [
            t
            for m in messages
            if m.WhichOneof("response") == "chunk"
            for t in m.chunk.output_logprobs.token_ids
        ]

    assert logprob_ids(four) == logprob_ids(one) == flat(chunks(one))
    assert list(four[-1].complete.output_ids) == chunks(four)[-1]


async def test_http_timing_switches_step_time_and_chunking_then_restores(sim: SimCluster) -> None:
    engine = sim.engines[0]
    status, timing = await http(engine, "POST", {"itl_ms": 20, "tokens_per_message": 2})
    assert status == 200 and timing["itl_ms"] == 20 and timing["tokens_per_message"] == 2
    loop = asyncio.get_running_loop()
    started = loop.time()
    messages = await stream(sim.addresses[0], 6)
    assert loop.time() - started >= 0.1  # 6 steps of 20 ms, not 0.2 ms
    assert [len(c) for c in chunks(messages)] == [2, 2, 2]
    status, timing = await http(engine, "DELETE")
    assert status == 200 and (timing["itl_ms"], timing["tokens_per_message"]) == (0.2, 1)
    assert [len(c) for c in chunks(await stream(sim.addresses[0], 3))] == [1, 1, 1]
    assert (await http(engine, "POST", {"max_num_seqs": 3}))[0] == 400  # not a timing option
    assert (await http(engine, "POST", {"tokens_per_message": 0}))[0] == 400


def test_the_command_line_carries_tokens_per_message() -> None:
    options = SimOptions(itl_ms=2, tokens_per_message=4)
    assert parse_args(simulator_argv(options, engines=1)[3:]).options == options
