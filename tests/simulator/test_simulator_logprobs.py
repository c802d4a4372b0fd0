"""Logprobs from the simulator, over real gRPC: vLLM's `logprobs`/`prompt_logprobs` and SGLang's
`return_logprob`/`top_logprobs_num`/`logprob_start_len`. The shapes are proven against a real vLLM engine
in tests/contract; these tests check what the values mean: each token's logprob is its probability under
the distribution it was drawn from, the lists are consistent, seeded requests repeat."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sg_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines

EOS = 128001
PROMPT = [128000, 9906, 11, 1917, 0, 3639, 374, 279, 7160]
FAST = SimOptions(ttft_ms=0.2, itl_ms=0.1, decode_ms_per_seq=0, prefill_ms_per_token=0)


@pytest.fixture
async def vllm() -> AsyncIterator[pb_grpc.VllmEngineStub]:
    sim = await start_engines(default_model_dir(), count=1, base_port=0, options=FAST)
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        yield pb_grpc.VllmEngineStub(channel)
    await sim.stop(grace=None)


@pytest.fixture
async def sglang() -> AsyncIterator[sg_grpc.SglangSchedulerStub]:
    sim: SimCluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=FAST, protocol="sglang"
    )
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        yield sg_grpc.SglangSchedulerStub(channel)
    await sim.stop(grace=None)


def request(prompt: list[int] = PROMPT, *, stream: bool = False, **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="lp",
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def generate(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [m async for m in stub.Generate(req)]


def entries(top: pb.TopLogProbs | sg.TopLogProbs) -> list[tuple[int, float]]:
    return list(zip(top.token_ids, top.values, strict=True))


def check_vllm_list(token: int, value: float, top: pb.TopLogProbs, k: int) -> None:
    """vLLM's order: the token first with its own logprob, then the likeliest others, k in all."""
    listed = entries(top)
    assert len(listed) == k and listed[0] == (token, value)
    others = [v for _, v in listed[1:]]
    assert others == sorted(others, reverse=True)
    assert len({t for t, _ in listed}) == k  # distinct tokens
    assert all(v <= 0 for _, v in listed)
    assert sum(math.exp(v) for _, v in listed) <= 1 + 1e-6  # a distribution's share


# --- vLLM ------------------------------------------------------------------------------------------


async def test_output_logprobs_per_token(vllm: pb_grpc.VllmEngineStub) -> None:
    done = (await generate(vllm, request(max_tokens=30, ignore_eos=True, logprobs=4, seed=5)))[0].complete
    out = done.output_logprobs
    assert list(out.token_ids) == list(done.output_ids) and len(out.token_logprobs) == 30
    for token, value, top in zip(out.token_ids, out.token_logprobs, out.top_logprobs, strict=True):
        check_vllm_list(token, value, top, 4)


async def test_logprobs_leave_the_tokens_alone_and_repeat(vllm: pb_grpc.VllmEngineStub) -> None:
    plain = (await generate(vllm, request(max_tokens=20, ignore_eos=True, seed=9)))[0].complete
    two = (await generate(vllm, request(max_tokens=20, ignore_eos=True, seed=9, logprobs=2)))[0].complete
    five = (await generate(vllm, request(max_tokens=20, ignore_eos=True, seed=9, logprobs=5)))[0].complete
    assert list(plain.output_ids) == list(two.output_ids) == list(five.output_ids)
    assert not plain.HasField("output_logprobs")
    assert list(two.output_logprobs.token_logprobs) == list(five.output_logprobs.token_logprobs)
    # A shorter top list is the start of a longer one: one distribution behind both.
    for short, long in zip(two.output_logprobs.top_logprobs, five.output_logprobs.top_logprobs, strict=True):
        assert entries(long)[:2] == entries(short)


async def test_stream_carries_each_deltas_logprobs(vllm: pb_grpc.VllmEngineStub) -> None:
    whole = (await generate(vllm, request(max_tokens=12, ignore_eos=True, seed=3, logprobs=3)))[0].complete
    messages = await generate(vllm, request(stream=True, max_tokens=12, ignore_eos=True, seed=3, logprobs=3))
    *chunks, last = messages
    streamed = [m.chunk.output_logprobs for m in chunks]
    assert all(len(lp.token_ids) == 1 for lp in streamed)
    assert [t for lp in streamed for t in lp.token_ids] == list(whole.output_logprobs.token_ids)
    assert [v for lp in streamed for v in lp.token_logprobs] == list(whole.output_logprobs.token_logprobs)
    assert last.complete.output_logprobs == streamed[-1]  # the complete repeats the last delta


async def test_greedy_takes_the_likeliest(vllm: pb_grpc.VllmEngineStub) -> None:
    done = (await generate(vllm, request(max_tokens=15, ignore_eos=True, temperature=0, logprobs=3)))[0]
    out = done.complete.output_logprobs
    for value, top in zip(out.token_logprobs, out.top_logprobs, strict=True):
        assert value == max(top.values) == top.values[0]
        assert list(top.values) == sorted(top.values, reverse=True)


async def test_natural_end_reports_eos_as_likeliest(vllm: pb_grpc.VllmEngineStub) -> None:
    done = (await generate(vllm, request(logprobs=2, seed=4)))[0].complete
    assert done.output_ids[-1] == EOS
    last = done.output_logprobs.top_logprobs[-1]
    assert entries(last)[0][0] == EOS and last.values[0] > last.values[1]
    assert EOS not in [t for top in done.output_logprobs.top_logprobs[:-1] for t in top.token_ids]


async def test_sampled_logprobs_are_calibrated(vllm: pb_grpc.VllmEngineStub) -> None:
    """How often a token is the step's likeliest matches the probability reported for the likeliest."""
    tops, hits = [], 0
    for seed in range(12):
        req = request(max_tokens=200, ignore_eos=True, seed=seed, logprobs=1)
        out = (await generate(vllm, req))[0].complete.output_logprobs
        for value, top in zip(out.token_logprobs, out.top_logprobs, strict=True):
            assert len(top.values) == 1 and top.values[0] == value  # k = 1: the token alone
        req = request(max_tokens=200, ignore_eos=True, seed=seed, logprobs=2)
        out = (await generate(vllm, req))[0].complete.output_logprobs
        for value, top in zip(out.token_logprobs, out.top_logprobs, strict=True):
            best = max(top.values)
            tops.append(math.exp(best))
            hits += value == best
    expected = sum(tops) / len(tops)
    assert abs(hits / len(tops) - expected) < 0.04, (hits / len(tops), expected)


async def test_zero_logprobs_has_no_top_lists(vllm: pb_grpc.VllmEngineStub) -> None:
    out = (await generate(vllm, request(max_tokens=5, ignore_eos=True, logprobs=0)))[
        0
    ].complete.output_logprobs
    assert len(out.token_logprobs) == 5 and not out.top_logprobs


@pytest.mark.parametrize(
    ("field", "count", "message"),
    [
        ("logprobs", 21, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        ("logprobs", -1, "Requested sample logprobs of 128256, which is greater than max allowed: 20"),
        ("logprobs", -2, "logprobs must be non-negative or -1, got -2."),
        ("prompt_logprobs", 21, "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
    ],
)
async def test_logprob_limits(vllm: pb_grpc.VllmEngineStub, field: str, count: int, message: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await generate(vllm, request(max_tokens=1, **{field: count}))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (failure.value.details() or "")


async def test_prompt_logprobs(vllm: pb_grpc.VllmEngineStub) -> None:
    prompt = [128000, *range(4000, 4299)]
    for _ in range(2):  # the second time the prompt is cached, but prompt logprobs skip the cache
        done = (await generate(vllm, request(prompt, max_tokens=1, prompt_logprobs=3)))[0].complete
        assert done.cached_tokens == 0
    assert (await generate(vllm, request(prompt, max_tokens=1)))[0].complete.cached_tokens == 288
    given = done.input_logprobs
    assert list(given.token_ids) == prompt
    assert not given.token_logprobs[0].HasField("value") and not given.top_logprobs[0].token_ids
    for token, value, top in zip(prompt[1:], given.token_logprobs[1:], given.top_logprobs[1:], strict=True):
        check_vllm_list(token, value.value, top, 3)
    # A stream carries them once, on its first chunk.
    messages = await generate(vllm, request(prompt, stream=True, max_tokens=3, prompt_logprobs=3))
    carrying = [
        m for m in messages if m.WhichOneof("response") == "chunk" and m.chunk.HasField("input_logprobs")
    ]
    assert carrying == [messages[0]] and messages[0].chunk.input_logprobs == given
    assert not messages[-1].complete.HasField("input_logprobs")


async def test_abort_ends_without_logprobs(vllm: pb_grpc.VllmEngineStub) -> None:
    call = vllm.Generate(request(stream=True, max_tokens=2000, ignore_eos=True, logprobs=1))
    first = await call.read()
    assert len(first.chunk.output_logprobs.token_ids) == 1
    await vllm.Abort(pb.AbortRequest(request_ids=["lp"]))
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    assert not rest[-2].chunk.token_ids and not rest[-2].chunk.HasField("output_logprobs")
    assert rest[-1].complete.finish_reason == "abort" and not rest[-1].complete.HasField("output_logprobs")


# --- SGLang ----------------------------------------------------------------------------------------


def sg_request(*, stream: bool, prompt: list[int] = PROMPT, **fields: object) -> sg.GenerateRequest:
    sampling = {k: fields.pop(k) for k in ("max_new_tokens", "ignore_eos", "n", "temperature") if k in fields}
    return sg.GenerateRequest(
        request_id="slp",
        tokenized=sg.TokenizedInput(input_ids=prompt),
        sampling_params=sg.SamplingParams(**sampling),
        stream=stream,
        **fields,
    )


async def sg_generate(
    stub: sg_grpc.SglangSchedulerStub, req: sg.GenerateRequest
) -> list[sg.GenerateResponse]:
    return [m async for m in stub.Generate(req)]


async def test_sglang_output_logprobs(sglang: sg_grpc.SglangSchedulerStub) -> None:
    fields = {"max_new_tokens": 10, "ignore_eos": True, "return_logprob": True, "top_logprobs_num": 3}
    whole = (await sg_generate(sglang, sg_request(stream=False, **fields)))[0].complete
    out = whole.output_logprobs
    assert list(out.token_ids) == list(whole.output_ids) and len(out.top_logprobs) == 10
    for token, value, top in zip(out.token_ids, out.token_logprobs, out.top_logprobs, strict=True):
        listed = entries(top)
        assert len(listed) == 3 and [v for _, v in listed] == sorted((v for _, v in listed), reverse=True)
        assert all(v <= 0 for _, v in listed)
        # The sampled token is listed where it ranks, or not at all when it ranks lower.
        assert (token, value) in listed or value <= listed[-1][1]
    messages = await sg_generate(sglang, sg_request(stream=True, **fields))
    *chunks, last = messages
    assert [v for m in chunks for v in m.chunk.output_logprobs.token_logprobs] == list(out.token_logprobs)
    assert last.complete.output_logprobs == chunks[-1].chunk.output_logprobs


async def test_sglang_input_logprobs_from_start(sglang: sg_grpc.SglangSchedulerStub) -> None:
    prompt = list(range(6000, 6100))
    plain = {"max_new_tokens": 2, "ignore_eos": True}
    await sg_generate(sglang, sg_request(stream=False, prompt=prompt, **plain))
    fields = {**plain, "return_logprob": True, "logprob_start_len": 40, "top_logprobs_num": 2}
    messages = await sg_generate(sglang, sg_request(stream=True, prompt=prompt, **fields))
    given = messages[0].chunk.input_logprobs
    assert list(given.token_ids) == prompt[40:] and len(given.token_logprobs) == 60
    assert not given.token_logprobs[0].HasField("value") and not given.top_logprobs[0].token_ids
    assert all(e.HasField("value") and e.value <= 0 for e in given.token_logprobs[1:])
    assert not any(m.chunk.HasField("input_logprobs") for m in messages[1:-1])
    # The prefix cache is read up to the start only (16-token blocks): 32 of the 96 it holds.
    assert messages[0].chunk.cached_tokens == 32
    cached = await sg_generate(sglang, sg_request(stream=False, prompt=prompt, **plain))
    assert cached[0].complete.cached_tokens == 96


async def test_sglang_refuses_a_start_past_the_prompt(sglang: sg_grpc.SglangSchedulerStub) -> None:
    fields = {"max_new_tokens": 1, "return_logprob": True, "logprob_start_len": len(PROMPT)}
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await sg_generate(sglang, sg_request(stream=False, **fields))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_sglang_without_return_logprob_sends_none(sglang: sg_grpc.SglangSchedulerStub) -> None:
    fields = {"max_new_tokens": 3, "ignore_eos": True, "top_logprobs_num": 3, "logprob_start_len": 0}
    messages = await sg_generate(sglang, sg_request(stream=True, **fields))
    for message in messages:
        body = message.chunk if message.WhichOneof("response") == "chunk" else message.complete
        assert not body.HasField("output_logprobs") and not body.HasField("input_logprobs")
