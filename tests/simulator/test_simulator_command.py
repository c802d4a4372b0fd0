"""The simulator's command line, as the benchmarks build it: `python -m extproc.simulator` reads back the
very options it was built from, and a process started from it serves them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from extproc.simulator import SimOptions
from extproc.simulator.__main__ import parse_args
from extproc.simulator.command import simulator_argv
from load.bench.gateways import FAST_ENGINES
from load.bench_routing.engines import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "options",
    [
        SimOptions(),
        FAST_ENGINES,
        EngineConfig().options(),
        SimOptions(max_model_len=4096, kv_events_zmq="ipc:///tmp/kv-{i}.ipc", kv_events_zmq_topic="kv"),
    ],
)
def test_the_command_line_carries_the_options(options: SimOptions) -> None:
    argv = simulator_argv(options, engines=3, metrics_port=0, protocol="sglang")
    assert argv[1:3] == ["-m", "extproc.simulator"]
    args = parse_args(argv[3:])
    assert args.options == options
    assert (args.engines, args.port, args.metrics_port, args.protocol) == (3, 0, 0, "sglang")


def test_routing_engines_argv_is_the_simulators() -> None:
    config = EngineConfig(engines=2, num_blocks=512, itl_ms=7.5)
    args = parse_args(config.argv()[3:])
    assert args.engines == 2 and args.metrics_port == 0
    assert (args.options.num_blocks, args.options.itl_ms, args.options.block_size) == (512, 7.5, 16)


def test_a_process_from_the_command_line_serves() -> None:
    argv = simulator_argv(FAST_ENGINES, engines=2)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert [line.split(" listening on ")[0] for line in lines] == ["engine 0", "engine 1"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
