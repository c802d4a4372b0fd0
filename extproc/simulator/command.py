"""The command line that runs simulated engines as a process of their own, from `SimOptions`: what the
benchmarks spawn. `python -m extproc.simulator` parses it back to the same options (tests check the round
trip), so a setting is named once, here and in `SimOptions`.
"""

from __future__ import annotations

import sys

from extproc.simulator.options import SimOptions
from extproc.simulator.script import script_json

# SimOptions field -> `python -m extproc.simulator` flag, for every option the command line takes.
FLAGS = {
    "ttft_ms": "--ttft-ms",
    "itl_ms": "--itl-ms",
    "prefill_ms_per_token": "--prefill-ms-per-token",
    "decode_ms_per_seq": "--decode-ms-per-seq",
    "time_scale": "--time-scale",
    "tokens_per_message": "--tokens-per-message",
    "max_model_len": "--max-model-len",
    "block_size": "--block-size",
    "num_blocks": "--num-blocks",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "data_parallel_size": "--data-parallel-size",
    "kv_events_zmq": "--kv-events-zmq",
    "kv_events_zmq_replay": "--kv-events-zmq-replay",
    "kv_events_zmq_topic": "--kv-events-zmq-topic",
    "script": "--script",
}


def simulator_argv(
    options: SimOptions,
    *,
    engines: int,
    port: int = 0,
    metrics_port: int | None = None,
    protocol: str = "vllm",
    python: str = sys.executable,
) -> list[str]:
    """`python -m extproc.simulator` hosting `engines` engines from `port` (0: free ports) with `options`;
    `metrics_port` serves /metrics and /faults (0: free ports)."""
    argv = [python, "-m", "extproc.simulator", "--port", str(port), "--engines", str(engines)]
    argv += ["--protocol", protocol]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    for field, flag in FLAGS.items():
        value = getattr(options, field)
        if field == "script":
            if value:
                argv += [flag, script_json(value)]
        elif value is not None and value != "":
            argv += [flag, str(value)]
    return argv
