"""`python -m extproc.simulator`: host N simulated engines until SIGINT/SIGTERM.

Prints `engine i listening on host:port` per engine once it serves (scripts wait for these lines),
then runs until signalled, stops the servers gracefully and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from extproc.models import resolve_model_dir
from extproc.simulator.cluster import PROTOCOLS, start_engines
from extproc.simulator.faults import FaultPlan
from extproc.simulator.options import SimOptions
from extproc.simulator.script import load_script_arg


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m extproc.simulator", description=__doc__)
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
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, default="vllm", help="gRPC service the engines speak"
    )
    timing = parser.add_argument_group("timing (see SimOptions)")
    timing.add_argument(
        "--ttft-ms", type=float, default=SimOptions.ttft_ms, help="fixed cost of a prefill step"
    )
    timing.add_argument("--itl-ms", type=float, default=SimOptions.itl_ms, help="fixed cost of a decode step")
    timing.add_argument("--prefill-ms-per-token", type=float, default=SimOptions.prefill_ms_per_token)
    timing.add_argument("--decode-ms-per-seq", type=float, default=SimOptions.decode_ms_per_seq)
    timing.add_argument(
        "--time-scale", type=float, default=SimOptions.time_scale, help="multiplies every duration"
    )
    timing.add_argument(
        "--tokens-per-message",
        type=int,
        default=SimOptions.tokens_per_message,
        help="streamed tokens per Generate message (1: a chunk per step)",
    )
    capacity = parser.add_argument_group("KV cache and scheduler")
    capacity.add_argument("--block-size", type=int, default=SimOptions.block_size)
    capacity.add_argument("--num-blocks", type=int, default=SimOptions.num_blocks)
    capacity.add_argument("--max-num-seqs", type=int, default=SimOptions.max_num_seqs)
    capacity.add_argument("--max-num-batched-tokens", type=int, default=SimOptions.max_num_batched_tokens)
    capacity.add_argument(
        "--data-parallel-size",
        type=int,
        default=SimOptions.data_parallel_size,
        help="DP ranks per engine, each with its own scheduler and KV cache (capacity flags are per rank)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /faults, /script and /timing on this port + i (0: free ports)",
    )
    tls = parser.add_argument_group("TLS (PEM files; plaintext without them)")
    tls.add_argument("--tls-cert", default=None, help="serve gRPC over TLS with this certificate chain")
    tls.add_argument("--tls-key", default=None, help="the private key of --tls-cert")
    tls.add_argument("--tls-client-ca", default=None, help="require client certificates this CA signed")
    parser.add_argument("--faults", default=None, help='fault settings for every engine, JSON: {"slow": 2}')
    zmq_events = parser.add_argument_group("vLLM's ZMQ KV-event channel (needs pyzmq and msgpack)")
    zmq_events.add_argument(
        "--kv-events-zmq",
        default=None,
        metavar="ENDPOINT",
        help='PUB endpoint per engine: "tcp://*:P" (engine i on P+i) or "ipc:///tmp/kv-{i}.ipc"',
    )
    zmq_events.add_argument(
        "--kv-events-zmq-replay", default=None, metavar="ENDPOINT", help="replay ROUTER endpoint, same rule"
    )
    zmq_events.add_argument("--kv-events-zmq-topic", default="", help="topic frame of every message")
    parser.add_argument(
        "--request-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="write one JSON line per request: its engine, and every engine's cached blocks of its prompt",
    )
    parser.add_argument(
        "--script",
        default=None,
        metavar="JSON|@FILE",
        help='scripted outputs: JSON rules or @file, e.g. [{"match": "weather", "text": "..."}]',
    )
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be at least 1")
    try:
        args.options = SimOptions(
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            prefill_ms_per_token=args.prefill_ms_per_token,
            decode_ms_per_seq=args.decode_ms_per_seq,
            time_scale=args.time_scale,
            tokens_per_message=args.tokens_per_message,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            data_parallel_size=args.data_parallel_size,
            kv_events_zmq=args.kv_events_zmq,
            kv_events_zmq_replay=args.kv_events_zmq_replay,
            kv_events_zmq_topic=args.kv_events_zmq_topic,
            script=load_script_arg(args.script) if args.script else (),
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
        )
        args.fault_settings = json.loads(args.faults) if args.faults else {}
        if not isinstance(args.fault_settings, dict):
            raise ValueError("--faults takes a JSON object")
        FaultPlan().set(**args.fault_settings)  # validate before starting anything
        if args.kv_events_zmq is not None:
            _check_zmq_endpoints(args)
    except ValueError as e:
        parser.error(str(e))
    return args


def _check_zmq_endpoints(args: argparse.Namespace) -> None:
    try:
        from extproc.simulator.zmq_publisher import endpoint_for
    except ImportError as e:
        raise ValueError(f"--kv-events-zmq needs pyzmq and msgpack (pip install pyzmq msgpack): {e}") from e
    # Every rank of every engine publishes on its own endpoint.
    slots = args.engines * args.options.data_parallel_size
    for template in (args.kv_events_zmq, args.kv_events_zmq_replay):
        if template is not None:
            endpoint_for(template, 0, slots)


async def serve(args: argparse.Namespace) -> None:
    # Handlers first: a signal that lands while the engines start still ends the run cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    cluster = await start_engines(
        resolve_model_dir(args.model_dir),
        count=args.engines,
        base_port=args.port,
        host=args.host,
        model_name=args.model_name,
        options=args.options,
        protocol=args.protocol,
        metrics_base_port=args.metrics_port,
        request_log=args.request_log,
    )
    for engine in cluster.engines:
        engine.faults.set(**args.fault_settings)
    try:
        for i, engine in enumerate(cluster.engines):
            extra = f" (metrics on port {engine.metrics_port})" if engine.metrics_port is not None else ""
            if engine.kv_publishers:  # one per DP rank
                extra += f" (kv events on {', '.join(p.endpoint for p in engine.kv_publishers)})"
            print(f"engine {i} listening on {engine.address}{extra}", flush=True)
        await stop.wait()
    finally:
        await cluster.stop()
        for i, engine in enumerate(cluster.engines):
            # What each engine saw, for whoever reads the log (the lifecycle tests do).
            s = engine.stats
            print(
                f"engine {i} stopped: {s.generate_requests} Generate calls, {s.completed} completed, "
                f"{s.aborts} aborted, {s.cancelled} cancelled, {s.abort_calls} Abort calls",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
