"""The simulator's scheduler and cache seen from a client: batching, queueing, timing, eviction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines


class Sim:
    def __init__(self, cluster: SimCluster, channel: grpc.aio.Channel) -> None:
        self.cluster = cluster
        self.stub = pb_grpc.VllmEngineStub(channel)

    @property
    def engine(self):  # type: ignore[no-untyped-def]
        return self.cluster.engines[0]


@asynccontextmanager
async def running(options: SimOptions) -> AsyncIterator[Sim]:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, options=options)
    try:
        async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
            yield Sim(cluster, channel)
    finally:
        await cluster.stop(grace=None)


def request(
    prompt: list[int], *, stream: bool = True, request_id: str = "r", **sampling: object
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def token_times(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[float]:
    """Arrival time of every chunk of a stream."""
    times = []
    async for message in stub.Generate(req):
        if message.WhichOneof("response") == "chunk":
            times.append(time.perf_counter())
    return times


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_running_window_queues_the_rest() -> None:
    async with running(SimOptions(max_num_seqs=2, itl_ms=5)) as sim:
        scheduler, faults = sim.engine.core.scheduler, sim.engine.core.faults
        # Who enters ("+r0") and leaves ("-r0") the running window, in the scheduler's order: what the
        # clients see of it arrives over four streams, in whatever order a busy machine delivers.
        order: list[str] = []
        window: set[str] = set()
        widest = 0
        freeze_pending = True

        def watch() -> None:
            nonlocal widest, freeze_pending
            now = {sequence.request_id for sequence in scheduler.running}
            order.extend([*(f"-{r}" for r in sorted(window - now)), *(f"+{r}" for r in sorted(now - window))])
            window.clear()
            window.update(now)
            widest = max(widest, len(now))
            if freeze_pending and len(now) == 2:
                freeze_pending = False
                faults.set(stall=True)

        # The loads are read from a state that cannot move: the scheduler is held until all four requests
        # are queued, then frozen again by the step that fills the running window (that step completes:
        # each of the two gets its first token, and none finishes or is admitted after it).
        faults.set(stall=True)
        scheduler.on_change.append(watch)
        prompts = [list(range(1000 + i * 50, 1040 + i * 50)) for i in range(4)]
        streams = [
            asyncio.ensure_future(
                token_times(sim.stub, request(p, request_id=f"r{i}", max_tokens=30, ignore_eos=True))
            )
            for i, p in enumerate(prompts)
        ]
        await eventually(lambda: len(scheduler.waiting) == 4)
        faults.set(stall=False)
        await eventually(lambda: not freeze_pending and all(s.output_len == 1 for s in scheduler.running))
        loads = (await sim.stub.GetLoads(pb.GetLoadsRequest())).loads[0]
        assert (loads.num_running_reqs, loads.num_waiting_reqs, loads.num_total_reqs) == (2, 2, 4)
        assert loads.num_waiting_uncached_tokens == 80  # two 40-token prompts, nothing cached
        assert loads.token_usage > 0 and loads.num_used_tokens > 0
        faults.set(stall=False)
        times = await asyncio.gather(*streams)
        assert [len(t) for t in times] == [30] * 4
        # The queued two start only once a running one has finished; never more than two run.
        entered = [i for i, change in enumerate(order) if change.startswith("+")]
        left = [i for i, change in enumerate(order) if change.startswith("-")]
        assert len(entered) == len(left) == 4, order
        assert entered[2] > left[0], order
        assert widest == 2
        loads = (await sim.stub.GetLoads(pb.GetLoadsRequest())).loads[0]
        assert (loads.num_running_reqs, loads.num_waiting_reqs, loads.token_usage) == (0, 0, 0)
        assert loads.gen_throughput > 0


async def test_decode_slows_as_the_batch_grows() -> None:
    # Step times large beside a busy machine's scheduling delays (tens of ms): 20 ms + 10 ms per sequence.
    options = SimOptions(ttft_ms=1, itl_ms=20, decode_ms_per_seq=10.0)
    async with running(options) as sim:
        alone = await token_times(sim.stub, request([128000, 5], max_tokens=8, ignore_eos=True))
        crowd = await asyncio.gather(
            *(
                token_times(sim.stub, request([128000, 6, i], max_tokens=8, ignore_eos=True))
                for i in range(16)
            )
        )

    def mean_gap(times: list[float]) -> float:
        return (times[-1] - times[0]) / (len(times) - 1)

    # Alone: 30 ms a token; with 16 decoding up to 180 ms (less while the batch fills and drains: ~130 ms
    # measured). Delays only lengthen gaps, so the crowd's bound holds on any machine; the alone bound
    # leaves 60 ms of slack per token.
    assert mean_gap(alone) < 0.09
    assert min(mean_gap(t) for t in crowd) > 0.1


async def test_prefill_cost_follows_uncached_tokens_and_time_scale() -> None:
    # Costs large beside scheduling delays: cold (100 + 1.0 * 1000) * 0.5 = 550 ms; warm, with 992 of the
    # 1000 tokens cached: (100 + 8) * 0.5 = 54 ms.
    options = SimOptions(ttft_ms=100, prefill_ms_per_token=1.0, block_size=16, time_scale=0.5)
    async with running(options) as sim:
        prompt = list(range(2000, 3000))
        await token_times(sim.stub, request(prompt, max_tokens=1))
        started = time.perf_counter()
        await token_times(sim.stub, request(prompt, max_tokens=1))
        warm = time.perf_counter() - started
        started = time.perf_counter()
        await token_times(sim.stub, request(list(range(4000, 5000)), max_tokens=1))
        cold = time.perf_counter() - started
    assert 0.55 <= cold < 1.5  # time_scale halves the 1.1 s the options describe
    assert 0.054 <= warm < 0.3  # only the uncached tail is prefilled


async def test_eviction_is_published_as_removed_events() -> None:
    async with running(SimOptions(block_size=16, num_blocks=6, ttft_ms=0, itl_ms=0)) as sim:
        batches: list[common_pb2.KvEventBatch] = []
        call = sim.stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        await call.initial_metadata()

        async def read() -> None:
            async for batch in call:
                batches.append(batch)

        reader = asyncio.ensure_future(read())
        stored: dict[tuple[int, ...], int] = {}
        for i in range(4):  # 4 prompts of 3 full blocks each through a 6-block cache
            prompt = list(range(10_000 + i * 100, 10_000 + i * 100 + 48))
            await token_times(sim.stub, request(prompt, max_tokens=1))
        await eventually(lambda: any(e.WhichOneof("data") == "removed" for b in batches for e in b.events))
        call.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    for batch in batches:
        for event in batch.events:
            if event.WhichOneof("data") == "stored":
                for block in event.stored.blocks:
                    stored[tuple(block.token_ids)] = block.block_hash
    removed = [
        h
        for b in batches
        for e in b.events
        if e.WhichOneof("data") == "removed"
        for h in e.removed.block_hashes
    ]
    assert set(removed) <= set(stored.values())  # only blocks that were stored are removed
    first_prompt_last_block = tuple(range(10_032, 10_048))
    assert stored[first_prompt_last_block] in removed  # LRU: the oldest prompt's tail goes first


async def test_preempted_sequences_recompute_and_finish() -> None:
    # 8 blocks of 16 tokens: two 60-token prompts growing by 60 tokens each cannot both fit.
    async with running(SimOptions(block_size=16, num_blocks=8, ttft_ms=0, itl_ms=0.1)) as sim:
        done = await asyncio.gather(
            *(
                token_times(
                    sim.stub,
                    request(
                        list(range(20_000 + i * 100, 20_060 + i * 100)),
                        request_id=f"p{i}",
                        max_tokens=60,
                        ignore_eos=True,
                    ),
                )
                for i in range(2)
            )
        )
        assert [len(times) for times in done] == [60, 60]
        assert sim.engine.core.scheduler.stats.preemptions > 0
        assert sim.engine.core.scheduler.cache.used_blocks == 0


async def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    options = SimOptions(max_num_batched_tokens=64, ttft_ms=2, prefill_ms_per_token=0, itl_ms=1)
    async with running(options) as sim:
        started = time.perf_counter()
        times = await token_times(sim.stub, request(list(range(3000, 3320)), max_tokens=1))
        # 320 prompt tokens in chunks of 64: five prefill steps of 2 ms before the first token.
        assert times[0] - started >= 0.009
        assert sim.engine.core.scheduler.stats.steps >= 5
