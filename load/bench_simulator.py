"""How much simulated traffic one core carries: `python -m load.bench_simulator`.

Starts the simulator as its own process (so the client's CPU is not counted), opens `--streams`
concurrent streaming Generate calls spread over its `--engines`, and reports the simulator process's CPU
use (from /proc), the tokens it delivered per second and per CPU-second, and how far the achieved
inter-token latency drifted from the configured one (a saturated simulator stretches it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


async def stream(stub: pb_grpc.VllmEngineStub, index: int, tokens: int) -> list[float]:
    prompt = [128000, *range(1000 + index * 64, 1000 + index * 64 + 63)]
    request = pb.GenerateRequest(
        request_id=f"bench-{index}",
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(max_tokens=tokens, ignore_eos=True),
        stream=True,
    )
    times = []
    async for message in stub.Generate(request):
        if message.WhichOneof("response") == "chunk":
            times.append(time.perf_counter())
    return times


async def drive(addresses: list[str], streams: int, tokens: int) -> list[list[float]]:
    channels = [grpc.aio.insecure_channel(address) for address in addresses]
    stubs = [pb_grpc.VllmEngineStub(channel) for channel in channels]
    try:
        return await asyncio.gather(*(stream(stubs[i % len(stubs)], i, tokens) for i in range(streams)))
    finally:
        for channel in channels:
            await channel.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench_simulator", description=__doc__)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    parser.add_argument("--itl-ms", type=float, default=20.0)
    args = parser.parse_args(argv)

    command = [sys.executable, "-m", "extproc.simulator", "--port", "0", "--engines", str(args.engines)]
    command += ["--itl-ms", str(args.itl_ms), "--ttft-ms", "5", "--decode-ms-per-seq", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env) as sim:
        try:
            assert sim.stdout is not None
            addresses = []
            for _ in range(args.engines):
                match = re.search(r"listening on (\S+)", sim.stdout.readline())
                assert match, "the simulator did not start"
                addresses.append(match.group(1))
            cpu_before, started = cpu_seconds(sim.pid), time.perf_counter()
            results = asyncio.run(drive(addresses, args.streams, args.tokens))
            wall = time.perf_counter() - started
            cpu = cpu_seconds(sim.pid) - cpu_before
        finally:
            sim.terminate()
            sim.wait(10)
    delivered = sum(len(times) for times in results)
    gaps = [b - a for times in results for a, b in itertools.pairwise(times)]
    print(f"engines={args.engines} streams={args.streams} tokens/stream={args.tokens} itl={args.itl_ms} ms")
    print(f"wall {wall:.2f} s, simulator CPU {cpu:.2f} s ({100 * cpu / wall:.0f}% of one core)")
    print(
        f"tokens delivered {delivered}: {delivered / wall:.0f}/s, "
        f"{delivered / max(cpu, 1e-9):.0f} per CPU-second"
    )
    print(
        f"inter-token latency: mean {1000 * statistics.mean(gaps):.1f} ms, "
        f"p99 {1000 * statistics.quantiles(gaps, n=100)[98]:.1f} ms (configured {args.itl_ms} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
