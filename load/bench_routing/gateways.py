"""The gateways under test, each started fresh per run on that run's engines.

Ours is `load.bench.gateways.start_ours` (Envoy + `extproc serve`, as an operator runs them) with the
policy as its `routing_policy` (extproc's documented setting, `EXTPROC_ROUTING_POLICY`). SMG runs with
`--policy cache_aware`: for gRPC workers it subscribes to every engine's `SubscribeKvEvents` on its own
(its log says "KV event stream connected" per worker and its metrics count the batches), so its
cache-aware policy routes on the same KV events as ours.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from extproc.contracts import ROUTING_POLICIES
from load.bench import gateways as bench_gateways
from load.bench.procs import StartError, free_port, spawn

# Every policy of ours: the router's registry.
POLICIES = ROUTING_POLICIES
SMG_POLICY = "cache_aware"


@dataclass
class Started:
    gateway: bench_gateways.Gateway
    # SMG's Prometheus port (its KV index gauges); None for ours.
    metrics_port: int | None = None


def smg_binary(no_smg: bool, smg_venv: Path, log_dir: Path) -> Path | None:
    """SMG's binary (installed into its cached venv on first use), or None when left out or not installable:
    the run then goes on with our gateways only and says so."""
    if no_smg:
        return None
    try:
        return bench_gateways.ensure_smg(smg_venv, log_dir)
    except (OSError, subprocess.CalledProcessError, StartError) as exc:
        print(f"SMG unavailable, running without it: {exc}", file=sys.stderr)
        return None


def start_ours(policy: str, engines: list[str], model: str, log_dir: Path, envoy_concurrency: int) -> Started:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    gateway = bench_gateways.start_ours(
        engines, model, log_dir, envoy_concurrency=envoy_concurrency, routing_policy=policy
    )
    return Started(gateway)


def start_smg(
    binary: Path,
    engines: list[str],
    model_dir: Path,
    model: str,
    log_dir: Path,
    extra: Sequence[str] = (),
) -> Started:
    """SMG's cache-aware policy, its own defaults otherwise (block size 16 as the engines use), and any
    `extra` flags."""
    port, metrics_port = free_port(), free_port()
    argv = [str(binary), "launch", "--worker-urls", *(f"grpc://{a}" for a in engines)]
    argv += ["--model-path", str(model_dir), "--chat-template", str(model_dir / "chat_template.jinja")]
    argv += ["--policy", SMG_POLICY, "--block-size", "16", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "info"]
    argv += list(extra)
    child = spawn("smg", argv, log_dir, env={**bench_gateways.SMG_ENV, "NO_COLOR": "1"})
    gateway = bench_gateways.Gateway("smg", f"http://127.0.0.1:{port}", [child])
    deadline = time.monotonic() + 90
    try:
        while not bench_gateways.chat_ok(gateway.base_url, model):
            gateway.check_alive()
            if time.monotonic() > deadline:
                raise StartError(f"smg: no successful chat completion after 90 s\n{child.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        gateway.stop()
        raise
    return Started(gateway, metrics_port)


def smg_kv_streams(log: Path) -> int:
    """How many "KV event stream connected" lines SMG logged: its subscriptions to the engines."""
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace").count("KV event stream connected")
    return 0
