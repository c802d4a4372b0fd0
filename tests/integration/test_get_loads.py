"""GetLoads polling: each healthy engine's own load report reaches the router, read the same way from
both protocols, and a load-aware policy steers requests away from an engine that reports a queue the
gateway did not cause (another gateway's traffic, simulated by calling the engine directly)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from extproc import _native
from extproc.models import default_model_dir
from extproc.pool import EnginePool
from extproc.simulator import SimOptions, start_engines
from tests.conftest import FreePorts, default_gateway
from tests.integration.harness import DirectCalls, local_stack, until

MODEL = "m"
MAX_NUM_SEQS = 8


class RecordingGateway:
    """The real native gateway, with every report_load call remembered."""

    def __init__(self, gateway: _native.Gateway) -> None:
        self._gateway = gateway
        self.reports: dict[str, tuple[int, int, float, int, int]] = {}

    def report_load(
        self, name: str, address: str, load: _native.EngineLoad, *, dp_rank: int | None = None
    ) -> bool:
        self.reports[address] = (
            load.running,
            load.waiting,
            load.kv_usage,
            load.max_running,
            load.waiting_uncached_tokens,
        )
        return self._gateway.report_load(name, address, load, dp_rank=dp_rank)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
async def test_each_protocols_get_loads_reaches_the_router(protocol: str) -> None:
    gateway = default_gateway(MODEL, policy="least_load")
    recording = RecordingGateway(gateway)
    options = SimOptions(max_num_seqs=MAX_NUM_SEQS, itl_ms=20)
    cluster = await start_engines(
        default_model_dir(), count=2, base_port=0, options=options, protocol=protocol
    )  # type: ignore[arg-type]
    queued, busy = cluster.engines
    direct = [DirectCalls(queued), DirectCalls(busy)]
    pool = EnginePool.create(
        recording,  # type: ignore[arg-type]
        MODEL,
        [f"grpc://{a}" for a in cluster.addresses],
        kv_events=False,
        load_interval_s=0.05,
    )
    try:
        queued.faults.set(stall=True)  # its requests wait: a queue
        direct[0].start(3)
        direct[1].start(1, prompt_len=300)  # one long generation holding KV blocks
        await until(lambda: len(queued.core.scheduler.waiting) == 3 and len(busy.core.scheduler.running) == 1)
        await pool.start(wait_s=10)
        await until(lambda: recording.reports.get(queued.address, (0, 0))[1] == 3)
        await until(lambda: recording.reports.get(busy.address, (0,))[0] == 1)
        # Three waiting 40-token prompts, none cached: all their tokens are prefill work queued.
        assert recording.reports[queued.address] == (0, 3, 0.0, MAX_NUM_SEQS, 3 * 40)
        running, waiting, kv_usage, window, queued_tokens = recording.reports[busy.address]
        assert (running, waiting, window, queued_tokens) == (1, 0, MAX_NUM_SEQS, 0)
        # The engine's own KV usage: the blocks of its one sequence out of its cache.
        assert kv_usage == pytest.approx(busy.core.scheduler.cache.usage, abs=0.01) and kv_usage > 0
    finally:
        await pool.close()
        for calls in direct:
            await calls.close()
        queued.faults.clear()
        await cluster.stop(grace=0)


def test_least_load_avoids_an_engine_whose_get_loads_reports_a_queue(tmp_path: Path) -> None:
    sim = SimOptions(max_num_seqs=MAX_NUM_SEQS)
    with local_stack(FreePorts(), tmp_path, routing_policy="least_load", sim=sim, load_interval=0.1) as stack:
        queued, free = stack.engines.engines
        # Stalled from the start, the engine never steps, so it publishes no KV events (nor their load
        # records): only its GetLoads answers tell the router about the queue.
        queued.faults.set(stall=True)

        async def queue_up() -> DirectCalls:
            direct = DirectCalls(queued)
            direct.start(4)
            await until(lambda: len(queued.core.scheduler.waiting) == 4)
            await asyncio.sleep(0.5)  # a few polls
            return direct

        direct = stack.loop.run(queue_up())
        try:
            client = stack.openai(timeout=20)
            for i in range(8):
                reply = client.chat.completions.create(
                    model=stack.model, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=4
                )
                assert reply.choices[0].message.content
            assert queued.stats.generate_requests == 4  # only the direct ones
            assert free.stats.generate_requests == 8
        finally:
            stack.loop.run(direct.close())
            queued.faults.clear()
