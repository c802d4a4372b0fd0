"""`python -m load.bench_routing.index_probe --engine ADDR ...`: our prefix index fed by a run's KV events,
to measure its memory per cached block on the benchmark's own trace.

It is what `extproc serve` builds (a native `Gateway` with the kv_events policy, `extproc.kv_events`
subscriptions to every engine), in a process of its own so that the benchmark process stays free of
gRPC threads. Every second it reads the index's size (`Gateway.routing_stats`); on SIGTERM it prints
one line, `INDEX {json}`: blocks indexed and bytes (index + per-engine hash maps) at the end and at the
peak, and batches applied.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
from collections.abc import Sequence

from extproc import _native
from extproc.kv_events import KvEventSubscriptions
from extproc.models import resolve_model_dir, served_model_name

_FIELD = re.compile(r"(\w+): (\d+)")
MAX_BODY = 8 << 20


def index_stats(gateway: _native.Gateway, model: str) -> dict[str, int]:
    _, stats = gateway.routing_stats(model)
    return {name: int(value) for name, value in _FIELD.findall(stats)}


async def probe(engines: list[str], model_dir: str | None, block_size: int) -> dict[str, object]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    folder = resolve_model_dir(model_dir)
    model = served_model_name(folder)
    gateway = _native.Gateway(max_body_bytes=MAX_BODY)
    gateway.add_model(model, str(folder), policy="kv_events")
    gateway.set_endpoints(model, [(address, block_size) for address in engines])
    outcomes: dict[str, int] = {}

    def on_batch(address: str, data: bytes) -> str:
        kind = gateway.apply_kv_events(model, address, data)
        outcomes[kind] = outcomes.get(kind, 0) + 1
        return kind

    subscriptions = KvEventSubscriptions(on_batch, lambda address: gateway.reset_kv_events(model, address))
    for address in engines:
        gateway.set_health(model, address, True)
        subscriptions.add(address)
    print("index probe subscribed", flush=True)
    peak: dict[str, int] = {"event_blocks": 0, "memory_bytes": 0}
    while not stop.is_set():
        stats = index_stats(gateway, model)
        if stats.get("event_blocks", 0) >= peak["event_blocks"]:
            peak = stats
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass
    await subscriptions.close()
    final = index_stats(gateway, model)
    if final.get("event_blocks", 0) >= peak.get("event_blocks", 0):
        peak = final
    return {"final": final, "peak": peak, "batches": outcomes}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.bench_routing.index_probe", description=__doc__)
    parser.add_argument("--engine", action="append", required=True, help="engine host:port (repeat)")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    result = asyncio.run(probe(args.engine, args.model_dir, args.block_size))
    print("INDEX " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
