"""`python -m load.simulator`: host N simulated engines until SIGINT/SIGTERM.

Prints `engine i listening on host:port` per engine once it serves (scripts wait for these lines),
then runs until signalled, stops the servers gracefully and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from extproc.models import resolve_model_dir
from load.simulator.cluster import start_engines
from load.simulator.options import SimOptions


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m load.simulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="first engine's port; 0 picks free ports")
    parser.add_argument("--engines", type=int, default=1, help="engines on consecutive ports")
    parser.add_argument(
        "--model-dir", default=None, help="HF style model folder (default: the default model)"
    )
    parser.add_argument("--model-name", default=None, help="served model name (default: the folder's name)")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="default: config.json max_position_embeddings"
    )
    parser.add_argument("--ttft-ms", type=float, default=SimOptions.ttft_ms, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=SimOptions.itl_ms, help="inter-token latency")
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be at least 1")
    if args.ttft_ms < 0 or args.itl_ms < 0:
        parser.error("--ttft-ms and --itl-ms must not be negative")
    return args


async def serve(args: argparse.Namespace) -> None:
    # Handlers first: a signal that lands while the engines start still ends the run cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    options = SimOptions(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, max_model_len=args.max_model_len)
    cluster = await start_engines(
        resolve_model_dir(args.model_dir),
        count=args.engines,
        base_port=args.port,
        host=args.host,
        model_name=args.model_name,
        options=options,
    )
    try:
        for i, address in enumerate(cluster.addresses):
            print(f"engine {i} listening on {address}", flush=True)
        await stop.wait()
    finally:
        await cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
