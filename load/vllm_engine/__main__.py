"""`python -m load.vllm_engine prepare|serve`: build the cached real-engine assets, or run an engine.

prepare  builds `.cache/vllm-venv` and `.cache/tiny-llama` unless finished builds are there (seconds when
         cached; a couple of minutes the first time). `make test` runs it before pytest.
serve    runs an engine on --port until SIGINT/SIGTERM; prints `vllm listening on host:port` once healthy.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence

from load.vllm_engine.launcher import start_vllm
from load.vllm_engine.tiny_model import ensure_tiny_model
from load.vllm_engine.venv import ensure_venv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load.vllm_engine", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help="build the vLLM venv and the tiny model")
    serve = commands.add_parser("serve", help="run a vLLM engine in the foreground")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    if args.command == "prepare":
        started = time.monotonic()
        python = ensure_venv(force=args.force)
        model = ensure_tiny_model(force=args.force)
        print(
            f"vLLM venv {python.parent.parent} and model {model} ready in {time.monotonic() - started:.0f} s"
        )
        return 0

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with start_vllm(host=args.host, port=args.port) as engine:
        print(f"vllm listening on {engine.address} (healthy after {engine.ready_s:.0f} s)", flush=True)
        print(f"kv events on {engine.kv_events_endpoint}, log {engine.log_path}", flush=True)
        while not stop.wait(0.5):
            if engine.process.poll() is not None:
                print(f"vLLM exited with {engine.process.returncode}:\n{engine.log_tail()}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
