"""The engine protocol behaviours the gateway relies on, asserted against the simulator and real vLLM alike.

Every test runs once per engine (`engine` is parametrized in conftest.py). A behaviour the real engine
shows and the simulator does not is a simulator bug: the simulator changes, never the assertion.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zipfile
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from tests.contract.conftest import Engine, Prompts

BLOCK = 128  # vLLM's CPU block size; the simulator is configured to match
MAX_MODEL_LEN = 2048


@pytest.fixture
async def stub(engine: Engine) -> AsyncIterator[pb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        yield pb_grpc.VllmEngineStub(channel)


def request(
    prompt: list[int], *, stream: bool = False, request_id: str = "contract", **sampling: object
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def generate(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [message async for message in stub.Generate(req, timeout=60)]


async def final(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> pb.GenerateComplete:
    messages = await generate(stub, req)
    assert [m.WhichOneof("response") for m in messages] == ["complete"]
    return messages[0].complete


async def time_to_first_token(stub: pb_grpc.VllmEngineStub, prompt: list[int]) -> tuple[float, int]:
    started = time.perf_counter()
    call = stub.Generate(request(prompt, stream=True, max_tokens=1, ignore_eos=True), timeout=60)
    first = await call.read()
    elapsed = time.perf_counter() - started
    while await call.read() is not grpc.aio.EOF:
        pass
    return elapsed, first.chunk.cached_tokens


# --- management RPCs -----------------------------------------------------------------------------


async def test_health_and_model_info(engine: Engine, stub: pb_grpc.VllmEngineStub) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy and health.message == "Health"

    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.served_model_name == engine.model_dir.name
    assert info.model_path == info.tokenizer_path == str(engine.model_dir)
    assert info.is_generation and not info.supports_vision
    assert info.max_context_length == info.max_req_input_len == MAX_MODEL_LEN
    assert info.vocab_size == 128256 and info.model_type == "llama"
    assert list(info.architectures) == ["LlamaForCausalLM"]
    assert list(info.eos_token_ids) == [128001, 128009] and info.bos_token_id == 128000


async def test_server_info(stub: pb_grpc.VllmEngineStub) -> None:
    server = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert (server.block_size, server.max_num_seqs, server.data_parallel_size) == (BLOCK, 128, 1)
    assert server.kv_cache_dtype == "auto" and server.model_dtype == "torch.bfloat16"
    # Config facts only: vLLM's servicer reports no server type, counters or uptime.
    assert server.server_type == "" and server.active_requests == 0 and server.uptime_seconds == 0


async def test_standard_health_service(engine: Engine) -> None:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_get_loads_shape(stub: pb_grpc.VllmEngineStub) -> None:
    loads = await stub.GetLoads(pb.GetLoadsRequest())
    assert loads.version and loads.dp_rank_count == 1 and len(loads.loads) == 1
    assert datetime.fromisoformat(loads.timestamp).tzinfo is not None
    load = loads.loads[0]
    assert load.dp_rank == 0 and load.max_running_requests == 128
    assert load.max_total_num_tokens > 0 and load.max_total_num_tokens % BLOCK == 0
    assert 0 <= load.token_usage < 1 and 0 <= load.cache_hit_rate <= 1
    assert load.num_total_reqs == load.num_running_reqs + load.num_waiting_reqs


async def test_get_tokenizer_bundle(engine: Engine, stub: pb_grpc.VllmEngineStub) -> None:
    chunks = [chunk async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert all(len(c.data) == 64 * 1024 for c in chunks[:-1]) and 0 < len(chunks[-1].data) <= 64 * 1024
    assert [c.sha256 for c in chunks[:-1]] == [""] * (len(chunks) - 1)
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = set(archive.namelist())
        assert {"tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"} <= names
        assert archive.read("tokenizer.json") == (engine.model_dir / "tokenizer.json").read_bytes()


# --- Generate framing, finish reasons, usage -------------------------------------------------------


async def test_stream_framing_and_length(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(40)
    messages = await generate(stub, request(prompt, stream=True, max_tokens=5, ignore_eos=True))
    *chunks, last = messages
    assert {m.WhichOneof("response") for m in chunks} == {"chunk"}
    # A token per step; a busy engine may deliver two steps' tokens in one chunk (vLLM merges the
    # deltas a slow consumer has not read yet), so the gateway must not count on one token per chunk.
    assert sum(len(m.chunk.token_ids) for m in chunks) == 5 and 1 <= len(chunks) <= 5
    for message in chunks:  # usage as deltas
        assert len(message.chunk.token_ids) == message.chunk.completion_tokens >= 1
        assert message.chunk.prompt_tokens == len(prompt) and message.chunk.index == 0
    done = last.complete
    assert last.WhichOneof("response") == "complete"
    # The stream's complete repeats the last delta, not the whole output.
    last_delta = chunks[-1].chunk
    assert list(done.output_ids) == list(last_delta.token_ids)
    assert done.completion_tokens == last_delta.completion_tokens
    assert done.finish_reason == "length" and done.WhichOneof("matched_stop") is None
    assert done.prompt_tokens == len(prompt)


async def test_non_stream_is_one_complete(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(40)
    done = await final(stub, request(prompt, max_tokens=7, ignore_eos=True, temperature=0))
    assert len(done.output_ids) == done.completion_tokens == 7
    assert done.finish_reason == "length" and done.prompt_tokens == len(prompt)
    # The same greedy request streamed yields the same tokens.
    messages = await generate(
        stub, request(prompt, stream=True, max_tokens=7, ignore_eos=True, temperature=0)
    )
    assert [t for m in messages[:-1] for t in m.chunk.token_ids] == list(done.output_ids)


async def test_stop_token_finishes_with_stop(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(30)
    natural = list(
        (await final(stub, request(prompt, max_tokens=4, ignore_eos=True, temperature=0))).output_ids
    )
    stop_id = natural[1]
    done = await final(stub, request(prompt, max_tokens=4, temperature=0, stop_token_ids=[stop_id]))
    assert list(done.output_ids) == natural[: natural.index(stop_id) + 1]  # the stop token is kept
    assert done.finish_reason == "stop" and done.matched_token_id == stop_id


async def test_n_choices(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(20)
    messages = await generate(stub, request(prompt, stream=True, n=2, seed=3, max_tokens=3, ignore_eos=True))
    completes = [m.complete for m in messages if m.WhichOneof("response") == "complete"]
    assert sorted(c.index for c in completes) == [0, 1]
    for index in (0, 1):
        chunks = [m.chunk for m in messages if m.WhichOneof("response") == "chunk" and m.chunk.index == index]
        assert sum(c.completion_tokens for c in chunks) == 3
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate(stub, request(prompt, n=2, temperature=0, max_tokens=3))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "greedy" in (failure.value.details() or "")


async def test_n_choices_not_streamed(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(20)
    messages = await generate(stub, request(prompt, n=3, seed=3, max_tokens=4, ignore_eos=True, logprobs=2))
    # One complete per choice, in index order, each with its own tokens and their logprobs.
    assert [m.WhichOneof("response") for m in messages] == ["complete"] * 3
    completes = [m.complete for m in messages]
    assert [c.index for c in completes] == [0, 1, 2]
    assert len({tuple(c.output_ids) for c in completes}) == 3
    for done in completes:
        assert done.completion_tokens == 4 and done.prompt_tokens == len(prompt)
        assert list(done.output_logprobs.token_ids) == list(done.output_ids)


async def test_prompt_longer_than_context_is_rejected(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate(stub, request(prompts.fresh(MAX_MODEL_LEN + 1), max_tokens=1))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- logprobs ----------------------------------------------------------------------------------------


def check_top_list(token: int, value: float, top: pb.TopLogProbs, k: int) -> None:
    """vLLM's top list: the token first with its own logprob, then the likeliest other tokens, k in all."""
    listed = list(zip(top.token_ids, top.values, strict=True))
    assert len(listed) == k and listed[0] == (token, value)
    others = [v for _, v in listed[1:]]
    assert others == sorted(others, reverse=True)
    assert len({t for t, _ in listed}) == k and all(v <= 0 for _, v in listed)


async def test_output_logprobs(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(30)
    sampling = {"max_tokens": 6, "ignore_eos": True, "seed": 11, "logprobs": 3}
    done = await final(stub, request(prompt, **sampling))
    out = done.output_logprobs
    assert list(out.token_ids) == list(done.output_ids) and len(out.token_logprobs) == 6
    assert len(out.top_logprobs) == 6 and not done.HasField("input_logprobs")
    for token, value, top in zip(out.token_ids, out.token_logprobs, out.top_logprobs, strict=True):
        check_top_list(token, value, top, 3)
    # Streamed: each chunk its delta's logprobs, the complete repeating the last chunk's.
    *chunks, last = await generate(stub, request(prompt, stream=True, **sampling))
    assert [len(m.chunk.output_logprobs.token_ids) for m in chunks] == [1] * 6
    assert [t for m in chunks for t in m.chunk.output_logprobs.token_ids] == list(out.token_ids)
    streamed = [v for m in chunks for v in m.chunk.output_logprobs.token_logprobs]
    assert streamed == pytest.approx(list(out.token_logprobs), abs=1e-4)
    assert last.complete.output_logprobs == chunks[-1].chunk.output_logprobs


async def test_greedy_logprobs_lead_with_the_likeliest(
    stub: pb_grpc.VllmEngineStub, prompts: Prompts
) -> None:
    done = await final(
        stub, request(prompts.fresh(30), max_tokens=4, ignore_eos=True, temperature=0, logprobs=2)
    )
    for value, top in zip(
        done.output_logprobs.token_logprobs, done.output_logprobs.top_logprobs, strict=True
    ):
        assert top.values[0] == value >= top.values[1]


async def test_zero_logprobs_carry_no_top_lists(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    done = await final(stub, request(prompts.fresh(30), max_tokens=3, ignore_eos=True, logprobs=0))
    assert len(done.output_logprobs.token_logprobs) == 3 and not done.output_logprobs.top_logprobs


@pytest.mark.parametrize(
    ("field", "count", "message"),
    [
        ("logprobs", 21, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        ("logprobs", -1, "Requested sample logprobs of 128256, which is greater than max allowed: 20"),
        ("logprobs", -2, "logprobs must be non-negative or -1, got -2."),
        ("prompt_logprobs", 21, "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
    ],
)
async def test_logprob_counts_beyond_the_limit_are_refused(
    stub: pb_grpc.VllmEngineStub, prompts: Prompts, field: str, count: int, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate(stub, request(prompts.fresh(10), max_tokens=1, **{field: count}))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (failure.value.details() or "")


async def test_prompt_logprobs(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(300)
    await final(stub, request(prompt, max_tokens=1))
    # A cached prompt is computed anew for its logprobs: no cached tokens, every position scored.
    done = await final(stub, request(prompt, max_tokens=2, ignore_eos=True, prompt_logprobs=2))
    assert done.cached_tokens == 0
    given = done.input_logprobs
    assert list(given.token_ids) == prompt and len(given.token_logprobs) == len(given.top_logprobs) == 300
    assert not given.token_logprobs[0].HasField("value") and not given.top_logprobs[0].token_ids
    for token, entry, top in zip(prompt[1:], given.token_logprobs[1:], given.top_logprobs[1:], strict=True):
        check_top_list(token, entry.value, top, 2)
    assert not done.HasField("output_logprobs")
    zero = await final(stub, request(prompt, max_tokens=1, prompt_logprobs=0))
    assert len(zero.input_logprobs.token_logprobs) == 300 and not zero.input_logprobs.top_logprobs


async def test_prompt_logprobs_stream_once(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(12)
    sampling = {"ignore_eos": True, "prompt_logprobs": 1, "seed": 2}
    messages = await generate(stub, request(prompt, stream=True, max_tokens=3, **sampling))
    carrying = [
        i for i, m in enumerate(messages) if getattr(m, m.WhichOneof("response")).HasField("input_logprobs")
    ]
    assert carrying == [0]  # the first chunk only
    assert len(messages[0].chunk.input_logprobs.token_ids) == 12
    # A one-token answer's complete repeats its only chunk, prompt logprobs included.
    first, done = await generate(stub, request(prompt, stream=True, max_tokens=1, **sampling))
    assert done.complete.input_logprobs == first.chunk.input_logprobs
    # n > 1: the request's first chunk carries them, whichever choice it is; a non-streamed request
    # repeats them on every choice's complete.
    # (Seen once on a loaded machine: the second choice's first chunk carried them too; the same copy.)
    messages = await generate(stub, request(prompt, stream=True, max_tokens=2, n=2, **sampling))
    carrying = [
        m for m in messages if m.WhichOneof("response") == "chunk" and m.chunk.HasField("input_logprobs")
    ]
    assert 1 <= len(carrying) <= 2
    assert messages[0].chunk.HasField("input_logprobs")
    assert all(m.chunk.input_logprobs == messages[0].chunk.input_logprobs for m in carrying)
    completes = await generate(stub, request(prompt, max_tokens=2, n=2, **sampling))
    assert [len(m.complete.input_logprobs.token_ids) for m in completes] == [12, 12]


# --- prefix caching --------------------------------------------------------------------------------


async def test_repeated_prompt_reports_cached_tokens(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(600)
    first = await final(stub, request(prompt, max_tokens=2, ignore_eos=True))
    assert first.cached_tokens == 0
    second = await final(stub, request(prompt, max_tokens=2, ignore_eos=True))
    # Whole blocks only, and never the last prompt token: (600 - 1) // 128 blocks.
    assert second.cached_tokens == (len(prompt) - 1) // BLOCK * BLOCK == 512
    streamed = await generate(stub, request(prompt, stream=True, max_tokens=2, ignore_eos=True))
    assert {m.chunk.cached_tokens for m in streamed[:-1]} == {512}  # on every chunk
    assert streamed[-1].complete.cached_tokens == 512


async def test_repeated_long_prompt_has_lower_ttft(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    length = 1900
    await time_to_first_token(stub, prompts.fresh(8))  # connection and engine warm
    fresh = [await time_to_first_token(stub, prompts.fresh(length)) for _ in range(2)]
    repeated_prompt = prompts.fresh(length)
    await time_to_first_token(stub, repeated_prompt)
    repeated = [await time_to_first_token(stub, repeated_prompt) for _ in range(3)]
    assert {cached for _, cached in fresh} == {0}
    assert {cached for _, cached in repeated} == {(length - 1) // BLOCK * BLOCK}
    assert min(t for t, _ in repeated) < min(t for t, _ in fresh)


async def test_flush_cache_forgets_prefixes(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    prompt = prompts.fresh(300)
    await final(stub, request(prompt, max_tokens=1))
    assert (await final(stub, request(prompt, max_tokens=1))).cached_tokens == 256
    flushed = await stub.FlushCache(common_pb2.FlushCacheRequest())
    assert flushed.success
    assert (await final(stub, request(prompt, max_tokens=1))).cached_tokens == 0


# --- abort ------------------------------------------------------------------------------------------


async def test_abort_ends_stream_with_abort(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    call = stub.Generate(
        request(
            prompts.fresh(10), stream=True, request_id="victim", max_tokens=1500, ignore_eos=True, logprobs=1
        ),
        timeout=60,
    )
    received = [await call.read() for _ in range(3)]
    assert all(m.WhichOneof("response") == "chunk" for m in received)
    assert all(len(m.chunk.output_logprobs.token_ids) == 1 for m in received)
    await stub.Abort(pb.AbortRequest(request_ids=["victim", "never-seen"]))
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    # Tokens already stepped may still arrive; the end is an empty delta, then an empty complete.
    *chunks, last = rest
    assert chunks and not chunks[-1].chunk.token_ids and chunks[-1].chunk.completion_tokens == 0
    assert last.complete.finish_reason == "abort" and not last.complete.output_ids
    # No tokens, no logprobs: neither the empty delta nor the complete carries any.
    assert not chunks[-1].chunk.HasField("output_logprobs") and not last.complete.HasField("output_logprobs")
    assert len(received) + len(chunks) < 1500
    assert await call.code() == grpc.StatusCode.OK


# --- KV events --------------------------------------------------------------------------------------


class EventStream:
    """A SubscribeKvEvents call read in the background into a list of batches."""

    def __init__(self, stub: pb_grpc.VllmEngineStub) -> None:
        self.call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        self.batches: list[common_pb2.KvEventBatch] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventStream:
        await self.call.initial_metadata()
        self._task = asyncio.ensure_future(self._read())
        await asyncio.sleep(0.5)  # the real servicer's ZMQ subscription connects after its headers
        return self

    async def _read(self) -> None:
        async for batch in self.call:
            self.batches.append(batch)

    async def __aexit__(self, *exc: object) -> None:
        self.call.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def stored(self) -> list[common_pb2.KvBlocksStored]:
        return [e.stored for b in self.batches for e in b.events if e.WhichOneof("data") == "stored"]

    async def wait_for(self, condition: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not condition():
            assert time.monotonic() < deadline, f"not seen in {within} s: {len(self.batches)} batches"
            await asyncio.sleep(0.02)


def stored_blocks(stream: EventStream) -> dict[tuple[int, ...], tuple[int, int | None]]:
    """Every stored block by its tokens: (its hash, the parent hash of its run's first block)."""
    found: dict[tuple[int, ...], tuple[int, int | None]] = {}
    for stored in stream.stored():
        parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
        for block in stored.blocks:
            found[tuple(block.token_ids)] = (block.block_hash, parent)
            parent = block.block_hash
    return found


async def test_kv_events_store_blocks_with_tokens_and_parents(
    stub: pb_grpc.VllmEngineStub, prompts: Prompts
) -> None:
    async with EventStream(stub) as events:
        prompt = prompts.fresh(300)  # two full blocks; the last 44 tokens fill none
        await final(stub, request(prompt, max_tokens=1))
        first, second = tuple(prompt[:BLOCK]), tuple(prompt[BLOCK : 2 * BLOCK])
        await events.wait_for(lambda: second in stored_blocks(events))
        blocks = stored_blocks(events)
        assert blocks[first][1] is None  # the chain starts here
        assert blocks[second][1] == blocks[first][0]  # chained to its parent
        assert tuple(prompt[2 * BLOCK :]) not in blocks
        for stored in events.stored():
            assert stored.tier == common_pb2.KV_CACHE_TIER_DEVICE
            assert stored.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
            assert all(b.block_size == BLOCK and len(b.token_ids) == BLOCK for b in stored.blocks)

        # A prompt sharing the first block stores only its new block, under the shared parent.
        sibling = [*prompt[:BLOCK], *prompts.fresh(200)[1:]]
        await final(stub, request(sibling, max_tokens=1))
        new_block = tuple(sibling[BLOCK : 2 * BLOCK])
        await events.wait_for(lambda: new_block in stored_blocks(events))
        assert stored_blocks(events)[new_block][1] == blocks[first][0]
        assert sum(tuple(b.token_ids) == first for s in events.stored() for b in s.blocks) == 1

        # Decoded tokens fill blocks too: they are stored once computed.
        grow = prompts.fresh(100)
        done = await final(stub, request(grow, max_tokens=60, ignore_eos=True))
        filled = tuple([*grow, *done.output_ids][:BLOCK])
        await events.wait_for(lambda: filled in stored_blocks(events))

    sequences = [b.sequence_number for b in events.batches if not b.load.load_only]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    assert all(b.HasField("load") and b.dp_rank == 0 for b in events.batches)
    event_ids = [e.event_id for b in events.batches for e in b.events]
    assert event_ids == list(range(1, len(event_ids) + 1))


async def test_kv_event_stream_carries_load_records(stub: pb_grpc.VllmEngineStub, prompts: Prompts) -> None:
    async with EventStream(stub) as events:
        await final(stub, request(prompts.fresh(200), max_tokens=1))
        await events.wait_for(lambda: any(b.events for b in events.batches))
        # An idle engine's stream goes on with load-only heartbeats about every second.
        await events.wait_for(lambda: any(b.load.load_only for b in events.batches), within=5)
    first = events.batches[0]
    assert first.load.sample == 1 and first.load.max_total_num_tokens > 0  # telemetry on the first record
    samples = [b.load.sample for b in events.batches]
    assert samples == list(range(1, len(samples) + 1))
    last_sequence = None
    for batch in events.batches:
        if not batch.load.load_only:
            last_sequence = batch.sequence_number
            continue
        assert not batch.events and batch.sequence_number == last_sequence  # repeats the last one
        assert batch.load.max_running_requests == 128 and batch.load.max_total_num_tokens > 0


async def test_kv_events_cannot_resume_from_a_cursor(stub: pb_grpc.VllmEngineStub) -> None:
    call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=5))
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        async for _ in call:
            pass
    assert failure.value.code() == grpc.StatusCode.OUT_OF_RANGE
