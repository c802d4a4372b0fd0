"""Gateway replicas on shared engines (issue 13): two extproc replicas behind one Envoy, two Envoys each
with its own extproc, or two SMG gateways, all on the same engines.

Every extproc replica subscribes to every engine's KV events on its own, so the prefix index each one
routes by is the same shared truth; what a replica cannot see is the other's requests in flight (its
load view is the engines' reports plus its own requests). SMG's replicas run without their mesh (no
`--enable-mesh`): each subscribes to the engines' KV events too, as one SMG does.

- `one`: one gateway (the baseline);
- `extproc_x2`: one Envoy whose ext_proc cluster has two endpoints, one per `extproc serve`; Envoy's
  round robin picks the replica per request (each request is one ext_proc stream);
- `envoy_x2`: two Envoy + extproc stacks, the clients split across the two Envoys;
- `smg_x2`: two `smg launch` processes, the clients split across them.

"Split": in closed loop client k uses gateway k mod 2; in open loop arrival i goes to gateway i mod 2
(as a round-robin balancer in front would), so a session's turns cross between replicas.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from load.bench import gateways as bench_gateways
from load.bench.procs import Child, StartError, free_port, spawn
from load.bench_routing import gateways

# Our topologies; `one` is the single-replica baseline, started by `gateways.start_ours`.
OURS_TOPOLOGIES = ("one", "extproc_x2", "envoy_x2")
SMG_TOPOLOGIES = ("one", "smg_x2")


def _spawn_extproc(name: str, engines: list[str], policy: str, log_dir: Path) -> tuple[Child, int]:
    """`extproc serve` as `load.bench.gateways.start_ours` runs it, under its own log name."""
    port = free_port()
    argv = [sys.executable, "-m", "extproc", "serve", "--listen", f"127.0.0.1:{port}"]
    for address in engines:
        argv += ["--engine", f"grpc://{address}"]
    argv += ["--log-level", "warning", "--metrics-port", str(free_port()), "--tool-parser", "hermes"]
    return spawn(name, argv, log_dir, env={"EXTPROC_ROUTING_POLICY": policy}), port


def envoy_bootstrap(extproc_ports: list[int], listen_port: int, admin_port: int) -> dict[str, object]:
    """Our Envoy bootstrap with one endpoint per extproc replica in its ext_proc cluster (round robin, the
    cluster's default balancing: each request's ext_proc stream goes to the next replica)."""
    from extproc.envoy_bootstrap import EXTPROC_CLUSTER, EnvoyOptions, build_bootstrap

    options = EnvoyOptions(
        listen_port=listen_port, admin_port=admin_port, extproc_target=f"127.0.0.1:{extproc_ports[0]}"
    )
    config = build_bootstrap(options)
    clusters = config["static_resources"]["clusters"]  # type: ignore[index]
    cluster = next(c for c in clusters if c["name"] == EXTPROC_CLUSTER)
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in extproc_ports
    ]
    return config


def _spawn_envoy(name: str, extproc_ports: list[int], log_dir: Path, concurrency: int) -> tuple[Child, int]:
    from extproc.envoy_bootstrap import envoy_binary

    port = free_port()
    path = log_dir / f"{name}.json"
    log_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(envoy_bootstrap(extproc_ports, port, free_port()), indent=1))
    argv = [envoy_binary(), "-c", str(path), "--log-level", "warning", "--disable-hot-restart"]
    argv += ["--concurrency", str(concurrency)]
    return spawn(name, argv, log_dir), port


def _ready(gateway: bench_gateways.Gateway, model: str, timeout_s: float) -> bench_gateways.Gateway:
    """`gateway` once a chat completion through it succeeds; stopped if it dies or never answers."""
    deadline = time.monotonic() + timeout_s
    try:
        while not bench_gateways.chat_ok(gateway.base_url, model):
            gateway.check_alive()
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in gateway.children)
                raise StartError(f"no successful chat completion after {timeout_s:.0f} s\n{tails}")
            time.sleep(0.2)
    except BaseException:
        gateway.stop()
        raise
    return gateway


def start_ours(
    topology: str, policy: str, engines: list[str], model: str, log_dir: Path, envoy_concurrency: int
) -> list[bench_gateways.Gateway]:
    """Our gateway(s) in `topology`: one base URL per front door (two for `envoy_x2`)."""
    if topology == "one":
        return [gateways.start_ours(policy, engines, model, log_dir, envoy_concurrency).gateway]
    if topology == "extproc_x2":
        a, port_a = _spawn_extproc("extproc-a", engines, policy, log_dir)
        b, port_b = _spawn_extproc("extproc-b", engines, policy, log_dir)
        envoy, port = _spawn_envoy("envoy", [port_a, port_b], log_dir, envoy_concurrency)
        gateway = bench_gateways.Gateway("ours", f"http://127.0.0.1:{port}", [a, b, envoy])
        # Both replicas must answer: a few requests, so Envoy's round robin reaches each.
        for _ in range(3):
            _ready(gateway, model, 60.0)
        return [gateway]
    if topology == "envoy_x2":
        out: list[bench_gateways.Gateway] = []
        try:
            for side in ("a", "b"):
                server, extproc_port = _spawn_extproc(f"extproc-{side}", engines, policy, log_dir)
                envoy, port = _spawn_envoy(f"envoy-{side}", [extproc_port], log_dir, envoy_concurrency)
                out.append(
                    _ready(
                        bench_gateways.Gateway("ours", f"http://127.0.0.1:{port}", [server, envoy]), model, 60
                    )
                )
        except BaseException:
            for gateway in out:
                gateway.stop()
            raise
        return out
    raise ValueError(f"unknown topology {topology!r}; ours: {', '.join(OURS_TOPOLOGIES)}")


def start_smg(
    topology: str,
    binary: Path,
    engines: list[str],
    model_dir: Path,
    model: str,
    log_dir: Path,
    extra: tuple[str, ...] = (),
) -> list[bench_gateways.Gateway]:
    """SMG cache_aware, one gateway or two (each its own process and log folder, no mesh)."""
    if topology not in SMG_TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; SMG: {', '.join(SMG_TOPOLOGIES)}")
    if topology == "one":
        return [gateways.start_smg(binary, engines, model_dir, model, log_dir, extra).gateway]
    out: list[bench_gateways.Gateway] = []
    try:
        for side in ("a", "b"):
            out.append(
                gateways.start_smg(binary, engines, model_dir, model, log_dir / f"smg-{side}", extra).gateway
            )
    except BaseException:
        for gateway in out:
            gateway.stop()
        raise
    return out
