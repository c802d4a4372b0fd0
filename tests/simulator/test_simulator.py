"""The engine simulator over real gRPC on loopback, with the smg_grpc_proto client stubs."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
from tokenizers import Tokenizer

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines

ROOT = Path(__file__).resolve().parents[2]
EOS = 128001  # the default model's first eos id (Llama 3 <|end_of_text|>)
PROMPT = [128000, 9906, 11, 1917, 0, 3639, 374, 279, 7160]
# Fast engines: timing is tested on its own.
FAST = SimOptions(ttft_ms=0.5, itl_ms=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    sim = await start_engines(default_model_dir(), count=1, base_port=0, options=FAST)
    yield sim
    await sim.stop(grace=None)


@pytest.fixture
async def stub(cluster: SimCluster) -> AsyncIterator[pb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
        yield pb_grpc.VllmEngineStub(channel)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))


def request(
    prompt: list[int] = PROMPT, *, stream: bool = False, request_id: str = "req", **sampling: object
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def generate(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [message async for message in stub.Generate(req)]


async def final(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> pb.GenerateComplete:
    """A non-streamed request's single `complete`."""
    messages = await generate(stub, req)
    assert [m.WhichOneof("response") for m in messages] == ["complete"]
    return messages[0].complete


async def read_rest(call) -> list[pb.GenerateResponse]:
    """The rest of a stream already read with `read()` (the iterator API may not be mixed in)."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def eventually(condition, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


# --- management RPCs -----------------------------------------------------------------------------


async def test_health_model_and_server_info(stub: pb_grpc.VllmEngineStub) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy

    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    model_dir = default_model_dir()
    assert info.served_model_name == model_dir.name
    assert info.model_path == info.tokenizer_path == str(model_dir)
    assert info.is_generation and info.model_type == "llama"
    assert list(info.eos_token_ids) == [128001, 128009]
    assert info.bos_token_id == 128000
    assert info.max_context_length == info.max_req_input_len == 8192
    assert info.vocab_size == 128256

    server = await stub.GetServerInfo(pb.GetServerInfoRequest())
    # As vLLM's servicer: config facts only (no server_type, counters or uptime).
    assert (server.block_size, server.max_num_seqs, server.data_parallel_size) == (16, 256, 1)
    assert server.kv_cache_dtype == "auto" and server.model_dtype == "torch.bfloat16"
    assert server.server_type == "" and server.active_requests == 0


async def test_other_rpcs_are_unimplemented(stub: pb_grpc.VllmEngineStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.Embed(pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=PROMPT)))
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- Generate: shapes and stop rules -------------------------------------------------------------


@pytest.mark.parametrize("prompt", [PROMPT, [128000, 15339], list(range(1000, 1300))])
async def test_stream_and_non_stream_agree(stub: pb_grpc.VllmEngineStub, prompt: list[int]) -> None:
    whole = await final(stub, request(prompt))
    messages = await generate(stub, request(prompt, stream=True))

    *chunks, last = messages
    assert [m.WhichOneof("response") for m in chunks] == ["chunk"] * len(chunks)
    assert last.WhichOneof("response") == "complete"
    # The non-streamed run left the prompt's full blocks cached (16 tokens each, never the last token).
    cached = (len(prompt) - 1) // 16 * 16
    for message in chunks:  # one token per step, usage as deltas
        assert len(message.chunk.token_ids) == message.chunk.completion_tokens == 1
        assert message.chunk.prompt_tokens == len(prompt)
        assert message.chunk.cached_tokens == cached and message.chunk.index == 0
    streamed = [t for m in chunks for t in m.chunk.token_ids]
    assert streamed == list(whole.output_ids)
    assert sum(m.chunk.completion_tokens for m in chunks) == whole.completion_tokens == len(streamed)

    # The stream's complete repeats only the last delta.
    done = last.complete
    assert list(done.output_ids) == list(chunks[-1].chunk.token_ids)
    assert done.completion_tokens == 1
    assert done.prompt_tokens == whole.prompt_tokens == len(prompt)
    assert done.finish_reason == whole.finish_reason == "stop"
    assert done.matched_token_id == whole.matched_token_id == EOS


async def test_natural_stop_ends_with_eos(stub: pb_grpc.VllmEngineStub) -> None:
    lengths = set()
    for i in range(6):
        done = await final(stub, request([128000, 1000 + i]))
        ids = list(done.output_ids)
        assert done.finish_reason == "stop"
        assert done.WhichOneof("matched_stop") == "matched_token_id" and done.matched_token_id == EOS
        # vLLM keeps the stop token in token_ids; it is the only eos.
        assert ids[-1] == EOS and EOS not in ids[:-1]
        assert 8 <= len(ids) - 1 <= 48
        lengths.add(len(ids))
    assert len(lengths) > 1  # the natural length varies with the request


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_finishes_with_length(stub: pb_grpc.VllmEngineStub, stream: bool) -> None:
    messages = await generate(stub, request(stream=stream, max_tokens=5))
    done = messages[-1].complete
    ids = [t for m in messages[:-1] for t in m.chunk.token_ids] if stream else list(done.output_ids)
    assert len(ids) == 5 and EOS not in ids
    assert done.finish_reason == "length"
    assert done.WhichOneof("matched_stop") is None


async def test_ignore_eos_runs_to_max_tokens(stub: pb_grpc.VllmEngineStub) -> None:
    done = await final(stub, request(max_tokens=120, ignore_eos=True))
    assert done.finish_reason == "length" and done.completion_tokens == 120
    assert EOS not in done.output_ids and 128009 not in done.output_ids


async def test_min_tokens_delays_eos(stub: pb_grpc.VllmEngineStub) -> None:
    done = await final(stub, request(min_tokens=60))
    ids = list(done.output_ids)
    assert len(ids) == 61 and ids[-1] == EOS and EOS not in ids[:-1]
    assert done.finish_reason == "stop"


async def test_stop_token_ids(stub: pb_grpc.VllmEngineStub) -> None:
    natural = list((await final(stub, request())).output_ids)
    stop_id = natural[3]
    done = await final(stub, request(stop_token_ids=[stop_id]))
    ids = list(done.output_ids)
    assert ids == natural[: natural.index(stop_id) + 1]
    assert done.finish_reason == "stop" and done.matched_token_id == stop_id
    # min_tokens masks the stop token until enough tokens are out.
    late = await final(stub, request(stop_token_ids=[stop_id], min_tokens=30))
    assert stop_id not in late.output_ids[:30]


async def test_stop_string(stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer) -> None:
    natural = list((await final(stub, request())).output_ids)
    word = tokenizer.decode([natural[4]]).strip()
    done = await final(stub, request(stop=[word]))
    assert done.finish_reason == "stop" and done.matched_stop_str == word
    assert word in tokenizer.decode(list(done.output_ids))
    assert word not in tokenizer.decode(list(done.output_ids[:-1]))
    # A stop string that spans two tokens.
    spanning = tokenizer.decode(natural[5:7])[-4:] + tokenizer.decode([natural[7]])[:2]
    done = await final(stub, request(stop=["zzzz", spanning]))
    assert done.finish_reason == "stop" and done.matched_stop_str == spanning
    streamed = await generate(stub, request(stop=["zzzz", spanning], stream=True))
    ids = [t for m in streamed[:-1] for t in m.chunk.token_ids]
    assert spanning in tokenizer.decode(ids) and spanning not in tokenizer.decode(ids[:-1])


async def test_context_limit_caps_output() -> None:
    sim = await start_engines(
        default_model_dir(), count=1, base_port=0, options=SimOptions(ttft_ms=0, itl_ms=0, max_model_len=32)
    )
    try:
        async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            done = await final(stub, request(list(range(100, 130)), ignore_eos=True))
            assert done.finish_reason == "length" and done.completion_tokens == 2
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await final(stub, request(list(range(100, 133))))
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "maximum model length of 32" in (failure.value.details() or "")
    finally:
        await sim.stop(grace=None)


async def test_tokenizer_eos_stops_without_a_matched_token(tmp_path: Path) -> None:
    """vLLM reports no stop reason for the tokenizer's own EOS, only for the other stop ids."""
    source = default_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "config.json").write_text('{"eos_token_id": 128009, "max_position_embeddings": 4096}')
    sim = await start_engines(tmp_path, count=1, base_port=0, options=FAST)
    try:
        async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            info = await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert info.served_model_name == tmp_path.name and info.max_context_length == 4096
            done = await final(stub, request())
    finally:
        await sim.stop(grace=None)
    assert done.output_ids[-1] == 128009 and done.finish_reason == "stop"
    assert done.WhichOneof("matched_stop") is None


async def test_bad_requests_are_rejected_and_counted(
    cluster: SimCluster, stub: pb_grpc.VllmEngineStub
) -> None:
    bad = [
        pb.GenerateRequest(request_id="text", text="hello"),
        request([]),
        request(list(range(9000))),  # longer than 8192
        request([200000]),  # out of vocabulary
        request(max_tokens=0),
    ]
    for req in bad:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await generate(stub, req)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, req
    stats = cluster.engines[0].stats
    assert stats.generate_requests == stats.rejected == len(bad)
    assert stats.completed == stats.active == stats.output_tokens == 0


# --- determinism and text ------------------------------------------------------------------------


async def test_deterministic_by_seed_and_by_prompt(stub: pb_grpc.VllmEngineStub) -> None:
    async def ids(prompt: list[int], **sampling: object) -> list[int]:
        return list((await final(stub, request(prompt, **sampling))).output_ids)

    assert await ids(PROMPT) == await ids(PROMPT)
    assert await ids(PROMPT) != await ids([*PROMPT, 42])
    assert await ids(PROMPT, seed=7) == await ids([128000, 5], seed=7)
    assert await ids(PROMPT, seed=7) != await ids(PROMPT, seed=8)


async def test_output_reads_like_words(stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer) -> None:
    shape = re.compile(r"( [a-z]{2,10}[.,]?)+")
    for seed in range(5):
        done = await final(stub, request(seed=seed, max_tokens=300, ignore_eos=True))
        text = tokenizer.decode(list(done.output_ids), skip_special_tokens=True)
        assert shape.fullmatch(text), text
        assert len(text.split()) >= 200  # words, not just punctuation


# --- abort, cancel, timing -----------------------------------------------------------------------


async def test_abort_ends_stream_with_abort(cluster: SimCluster, stub: pb_grpc.VllmEngineStub) -> None:
    call = stub.Generate(request(stream=True, request_id="victim", ignore_eos=True, max_tokens=100000))
    received = [await call.read() for _ in range(3)]
    assert all(m.WhichOneof("response") == "chunk" for m in received)
    await stub.Abort(pb.AbortRequest(request_ids=["victim", "unknown"]))
    rest = await read_rest(call)
    # vLLM's abort: an empty delta, then a complete with finish_reason "abort".
    *chunks, last = rest
    assert chunks and chunks[-1].chunk.completion_tokens == 0 and not chunks[-1].chunk.token_ids
    assert last.complete.finish_reason == "abort" and not last.complete.output_ids
    assert await call.code() == grpc.StatusCode.OK
    stats = cluster.engines[0].stats
    assert (stats.aborts, stats.completed, stats.cancelled, stats.active) == (1, 0, 0, 0)


async def test_abort_non_streamed_returns_tokens_so_far(
    cluster: SimCluster, stub: pb_grpc.VllmEngineStub
) -> None:
    req = request(request_id="slow", ignore_eos=True, max_tokens=100000)
    pending = asyncio.ensure_future(final(stub, req))
    stats = cluster.engines[0].stats
    await eventually(lambda: stats.output_tokens >= 5)
    await stub.Abort(pb.AbortRequest(request_ids=["slow"]))
    done = await pending
    assert done.finish_reason == "abort" and done.completion_tokens >= 5
    # Same request, same tokens: what was out is the start of the full answer.
    full = await final(stub, request(ignore_eos=True, max_tokens=done.completion_tokens + 5))
    assert list(done.output_ids) == list(full.output_ids[: done.completion_tokens])
    assert stats.aborts == 1


async def test_client_cancel_stops_generation(cluster: SimCluster, stub: pb_grpc.VllmEngineStub) -> None:
    stats = cluster.engines[0].stats
    call = stub.Generate(request(stream=True, ignore_eos=True, max_tokens=100000))
    for _ in range(3):
        await call.read()
    call.cancel()
    await eventually(lambda: stats.cancelled == 1 and stats.active == 0)
    produced = stats.output_tokens
    await asyncio.sleep(0.05)
    assert stats.output_tokens == produced  # nothing generated for a caller that left
    assert stats.aborts == stats.completed == 0


async def test_client_deadline_on_non_streamed_request_is_a_cancel(
    cluster: SimCluster, stub: pb_grpc.VllmEngineStub
) -> None:
    stats = cluster.engines[0].stats
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate_with_timeout(stub, request(ignore_eos=True, max_tokens=100000), 0.1)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: stats.cancelled == 1 and stats.active == 0)
    assert stats.output_tokens > 0 and stats.completed == 0


async def generate_with_timeout(
    stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest, seconds: float
) -> list[pb.GenerateResponse]:
    return [message async for message in stub.Generate(req, timeout=seconds)]


async def test_timing_applies_to_stream_and_non_stream() -> None:
    options = SimOptions(ttft_ms=60, itl_ms=10)
    sim = await start_engines(default_model_dir(), count=1, base_port=0, options=options)
    try:
        async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            await stub.HealthCheck(pb.HealthCheckRequest())  # connect first
            started = time.monotonic()
            call = stub.Generate(request(stream=True, ignore_eos=True, max_tokens=6))
            await call.read()
            first = time.monotonic() - started
            await read_rest(call)
            stream_total = time.monotonic() - started
            started = time.monotonic()
            await final(stub, request(ignore_eos=True, max_tokens=6))
            whole_total = time.monotonic() - started
    finally:
        await sim.stop(grace=None)
    assert 0.055 <= first < 0.5
    assert 0.105 <= stream_total < 1.0  # 60 ms + 5 * 10 ms
    assert 0.105 <= whole_total < 1.0


# --- cluster and CLI -----------------------------------------------------------------------------


async def test_engines_share_nothing_but_the_model() -> None:
    sim = await start_engines(default_model_dir(), count=3, base_port=0, model_name="sim", options=FAST)
    try:
        assert len(set(sim.addresses)) == 3
        for address in sim.addresses:
            async with grpc.aio.insecure_channel(address) as channel:
                info = await pb_grpc.VllmEngineStub(channel).GetModelInfo(pb.GetModelInfoRequest())
                assert info.served_model_name == "sim"
        async with grpc.aio.insecure_channel(sim.addresses[1]) as channel:
            await final(pb_grpc.VllmEngineStub(channel), request())
        assert [e.stats.generate_requests for e in sim.engines] == [0, 1, 0]
    finally:
        await sim.stop(grace=None)


async def test_consecutive_ports(free_ports) -> None:
    base = free_ports.block(2)  # tests/conftest.py's shared helper
    sim = await start_engines(default_model_dir(), count=2, base_port=base, options=FAST)
    try:
        assert [e.port for e in sim.engines] == [base, base + 1]
        assert sim.addresses == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    finally:
        await sim.stop(grace=None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_serves_until_signalled(signum: signal.Signals) -> None:
    command = [sys.executable, "-m", "extproc.simulator", "--port", "0", "--engines", "2", "--ttft-ms", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            # A reader thread, so a simulator that never prints fails the test instead of hanging it.
            lines: queue.Queue[str] = queue.Queue()
            assert process.stdout is not None
            threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
            first = lines.get(timeout=30)
            threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
            second = lines.get(timeout=30)
            addresses = []
            for i, line in enumerate([first, second]):
                match = re.fullmatch(rf"engine {i} listening on (127\.0\.0\.1:\d+)\n", line)
                assert match, line
                addresses.append(match.group(1))
            for address in addresses:
                with grpc.insecure_channel(address) as channel:
                    stub = pb_grpc.VllmEngineStub(channel)
                    assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=5).healthy
                    responses = list(stub.Generate(request(max_tokens=3), timeout=5))
                    assert responses[-1].complete.completion_tokens == 3
            process.send_signal(signum)
            _, errors = process.communicate(timeout=10)
            assert process.returncode == 0, errors
            assert "Traceback" not in errors
        finally:
            if process.poll() is None:
                process.kill()
