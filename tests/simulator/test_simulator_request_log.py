"""The simulator's request log (`--request-log`): per Generate, the engine it reached and how many
blocks of its prompt every engine of the cluster had cached, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimOptions, start_engines
from extproc.simulator.__main__ import parse_args

FAST = SimOptions(ttft_ms=0.5, itl_ms=0.2, block_size=16)
# 100 ordinary word ids: six full blocks of 16; the block holding the last token is never reused.
PROMPT = [128000] + [1000 + i for i in range(99)]


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def send(address: str, prompt: list[int], request_id: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        req = pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=prompt),
            sampling_params=pb.SamplingParams(max_tokens=2),
        )
        async for _ in stub.Generate(req):
            pass


async def test_each_request_names_its_engine_and_every_engines_cached_blocks(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    sim = await start_engines(default_model_dir(), count=3, base_port=0, options=FAST, request_log=log)
    try:
        await send(sim.addresses[0], PROMPT, "first")  # nothing cached anywhere yet
        await send(sim.addresses[2], PROMPT, "elsewhere")  # engine 0 holds it; engine 2 does not
        await send(sim.addresses[0], PROMPT[:50] + [7] * 30, "half")  # a 50-token shared head: 3 blocks
    finally:
        await sim.stop(grace=None)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["id"], x["engine"], x["prompt"], x["block"]) for x in lines] == [
        ("first", 0, 100, 16),
        ("elsewhere", 2, 100, 16),
        ("half", 0, 80, 16),
    ]
    assert [x["held"] for x in lines] == [[0, 0, 0], [6, 0, 0], [3, 0, 3]]
    # Nothing queued on the fleet when each arrived: they were sent one after another.
    assert all(x["waiting"] == x["running"] == x["prefill"] == [0, 0, 0] for x in lines)
    assert lines[0]["t"] <= lines[1]["t"] <= lines[2]["t"]


async def test_no_log_unless_asked() -> None:
    sim = await start_engines(default_model_dir(), count=1, base_port=0, options=FAST)
    try:
        await send(sim.addresses[0], PROMPT, "r")
        assert sim.request_log is None and sim.engines[0].core.request_log is None
    finally:
        await sim.stop(grace=None)


def test_the_command_line_takes_a_log_path(tmp_path: Path) -> None:
    args = parse_args(["--port", "0", "--request-log", str(tmp_path / "r.jsonl")])
    assert args.request_log == tmp_path / "r.jsonl"
    assert parse_args(["--port", "0"]).request_log is None


async def test_a_prefill_in_progress_counts_as_work_left_on_its_engine(tmp_path: Path) -> None:
    # A 400-token prompt prefills in one 0.4 s step: running, not waiting, until it is computed.
    slow = SimOptions(ttft_ms=0.5, itl_ms=0.2, prefill_ms_per_token=1.0, block_size=16)
    log = tmp_path / "requests.jsonl"
    sim = await start_engines(default_model_dir(), count=2, base_port=0, options=slow, request_log=log)
    try:
        long = [128000] + [2000 + i for i in range(399)]
        first = asyncio.create_task(send(sim.addresses[0], long, "long"))
        await eventually(lambda: bool(sim.engines[0].core.scheduler.running))
        await send(sim.addresses[1], PROMPT, "beside")
        await first
    finally:
        await sim.stop(grace=None)
    beside = [json.loads(line) for line in log.read_text().splitlines()][1]
    assert beside["id"] == "beside"
    assert (beside["waiting"], beside["running"], beside["prefill"]) == ([0, 0], [1, 0], [400, 0])
