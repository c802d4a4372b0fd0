"""The processes a benchmark runs: the simulated engines, our stack (Envoy + `extproc serve`) and SMG.

Each gateway is a set of root processes whose CPU time (with descendants) is the gateway's cost, a base
URL, and a stop(). Gateways are ready when a chat completion through them succeeds, not merely when a
port accepts: that proves every engine was registered and the whole path works.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from extproc.models import cache_root
from extproc.simulator.command import simulator_argv
from extproc.simulator.options import SimOptions
from load.bench.procs import Child, StartError, free_port, spawn, wait_for
from load.loadgen.workloads import TOOL_SCRIPT

SMG_VERSION = "1.13.0"
ROOT = Path(__file__).resolve().parents[2]
# In extproc's cache folder, shared by every checkout on the machine.
DEFAULT_SMG_VENV = cache_root() / "bench" / "smg-venv"
# SMG fetches multimodal configs from a model hub on some requests; offline that stalls 5 s each time.
# Pointing it at a closed port makes the lookup fail at once.
SMG_ENV = {"HF_ENDPOINT": "http://127.0.0.1:9"}
_LISTENING = re.compile(r"engine (\d+) listening on (\S+) \(metrics on port (\d+)\)")


@dataclass
class Engines:
    child: Child
    addresses: list[str]
    argv: list[str]
    # Each engine's HTTP control port (/timing, /faults, /metrics).
    control_ports: list[int] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [self.child.pid]

    def retime(self, timing: dict[str, float] | None) -> None:
        """Every engine's step times and tokens per message from now on (the simulator's /timing);
        None: back to the fast mode they started in."""
        body = json.dumps(timing).encode() if timing else None
        for port in self.control_ports:
            url = f"http://127.0.0.1:{port}/timing"
            request = urllib.request.Request(url, body, method="POST" if timing else "DELETE")
            with urllib.request.urlopen(request, timeout=10) as resp:
                resp.read()


# Fast mode: every simulated duration zero, and room for 8 clients' 30k-token prompts in each engine's
# KV cache and step budget (no chunked prefill, no preemption), so the engines cost as little as they can
# and the gateway is what is measured.
FAST_ENGINES = SimOptions(
    ttft_ms=0,
    itl_ms=0,
    prefill_ms_per_token=0,
    decode_ms_per_seq=0,
    time_scale=0,
    num_blocks=32768,
    max_num_batched_tokens=262144,
)


def start_engines(count: int, log_dir: Path, max_model_len: int) -> Engines:
    """The simulator in its own process, in fast mode: near-zero engine time, so gateways are measured."""
    options = replace(FAST_ENGINES, max_model_len=max_model_len, script=TOOL_SCRIPT)
    argv = simulator_argv(options, engines=count, metrics_port=0)
    child = spawn("engines", argv, log_dir)
    found: list[re.Match[str]] = []

    def ready() -> bool:
        found[:] = list(_LISTENING.finditer(child.log.read_text(errors="replace")))
        return len(found) >= count

    wait_for(child, ready, f"{count} 'engine i listening' lines", timeout_s=60)
    return Engines(child, [m.group(2) for m in found], argv, [int(m.group(3)) for m in found])


@dataclass
class Gateway:
    name: str
    base_url: str
    children: list[Child]

    @property
    def processes(self) -> dict[str, int]:
        return {c.name: c.pid for c in self.children}

    def check_alive(self) -> None:
        for child in self.children:
            if not child.alive():
                raise StartError(f"{child.name} died (exit {child.proc.returncode}):\n{child.log_tail()}")

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


def chat_ok(base_url: str, model: str) -> bool:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 2}
    ).encode()
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", body, {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def _wait_chat(gateway: Gateway, model: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gateway.check_alive()
        if chat_ok(gateway.base_url, model):
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in gateway.children)
    raise StartError(f"{gateway.name}: no successful chat completion after {timeout_s:.0f} s\n{tails}")


# Our stack's bench targets by where engine responses become answers (the `response_path` setting).
OURS_TARGETS = {"ours": "ext_proc", "ours-module": "module"}


def start_ours(
    engines: list[str],
    model: str,
    log_dir: Path,
    *,
    envoy_concurrency: int,
    routing_policy: str | None = None,
    response_path: str = "ext_proc",
    model_dir: Path | None = None,
    stream_flush_ms: int = 0,
    timeout_s: float = 60.0,
    extra_env: dict[str, str] | None = None,
) -> Gateway:
    """`extproc serve` and Envoy in front of it, as separate processes, as an operator would run them;
    `routing_policy` and `response_path` go to extproc through their documented settings
    (EXTPROC_ROUTING_POLICY, EXTPROC_RESPONSE_PATH); with "module", Envoy loads the response module with
    `model_dir`'s tokenizer and holds stream bytes `stream_flush_ms` (the gateway is named "ours-module",
    logs apart). `extra_env` adds settings (EXTPROC_KUBERNETES_API for `k8s://` engines)."""
    from extproc.envoy_bootstrap import EnvoyOptions, ResponseModule, envoy_binary, render_bootstrap
    from extproc.envoy_module import module_path
    from extproc.models import default_model_dir

    name = next(t for t, path in OURS_TARGETS.items() if path == response_path)
    # Names of this gateway's children and files: apart from the other path's when both run.
    suffix = "" if name == "ours" else "-module"

    extproc_port, port, admin_port = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "extproc", "serve", "--listen", f"127.0.0.1:{extproc_port}"]
    for address in engines:
        # An address, or an engine source with its scheme (`k8s://...`).
        argv += ["--engine", address if "://" in address else f"grpc://{address}"]
    # Metrics served as an operator runs them, on a free port (9464 may be another stack's);
    # `EXTPROC_METRICS=off` in the benchmark's environment measures the gateway without counting.
    argv += ["--log-level", "warning", "--metrics-port", str(free_port())]
    # The tool-stream workload's calls are Hermes (the default model's inferred format is Llama 3 JSON).
    argv += ["--tool-parser", "hermes"]
    # Explicit either way, whatever the setting's default is.
    env = {**(extra_env or {}), "EXTPROC_RESPONSE_PATH": response_path}
    if routing_policy is not None:
        env["EXTPROC_ROUTING_POLICY"] = routing_policy
    server = spawn("extproc", argv, log_dir, env=env, log_name=f"extproc{suffix}")
    module = None
    if response_path == "module":
        served = ((model, str(model_dir or default_model_dir())),)
        module = ResponseModule(module_path(), served, stream_flush_ms)
    options = EnvoyOptions(
        listen_port=port,
        admin_port=admin_port,
        extproc_target=f"127.0.0.1:{extproc_port}",
        response_module=module,
    )
    config = log_dir / f"envoy{suffix}.json"
    config.write_text(render_bootstrap(options))
    envoy_argv = [envoy_binary(), "-c", str(config), "--log-level", "warning", "--disable-hot-restart"]
    envoy_argv += ["--concurrency", str(envoy_concurrency)]
    envoy = spawn("envoy", envoy_argv, log_dir, log_name=f"envoy{suffix}")
    gateway = Gateway(name, f"http://127.0.0.1:{port}", [server, envoy])
    try:
        _wait_chat(gateway, model, timeout_s)
    except BaseException:
        gateway.stop()
        raise
    return gateway


RELAY = "envoy-relay"
_TYPE = "type.googleapis.com/"


def _relay_bootstrap(port: int, admin_port: int, engines: list[str]) -> dict[str, object]:
    """Envoy with nothing but its router: any request round-robin to the engines over h2c."""
    endpoints = []
    for address in engines:
        host, _, engine_port = address.rpartition(":")
        socket = {"address": host, "port_value": int(engine_port)}
        endpoints.append({"endpoint": {"address": {"socket_address": socket}}})
    hcm = {
        "@type": _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "relay",
        "codec_type": "AUTO",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "engines",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "engines", "timeout": "0s"}}],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    http2 = {
        "@type": _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
    local = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "relay",
                    "address": local,
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "engines",
                    "type": "STATIC",
                    "lb_policy": "ROUND_ROBIN",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http2
                    },
                    "load_assignment": {
                        "cluster_name": "engines",
                        "endpoints": [{"lb_endpoints": endpoints}],
                    },
                }
            ],
        },
    }


def start_relay(engines: list[str], log_dir: Path, *, envoy_concurrency: int) -> Gateway:
    """Envoy alone relaying the floor's gRPC calls to the engines (router only, no ext_proc, no module):
    its CPU per request is what Envoy costs to pass each engine message on, the floor under any answer
    path hosted in Envoy. Its `base_url` is the gRPC address the floor's client calls."""
    from extproc.envoy_bootstrap import envoy_binary
    from extproc.supervisor import tcp_accepts

    port, admin_port = free_port(), free_port()
    config = log_dir / "envoy-relay.json"
    config.write_text(json.dumps(_relay_bootstrap(port, admin_port, engines), indent=1))
    argv = [envoy_binary(), "-c", str(config), "--log-level", "warning", "--disable-hot-restart"]
    argv += ["--concurrency", str(envoy_concurrency)]
    envoy = spawn("envoy", argv, log_dir, log_name="envoy-relay")
    try:
        wait_for(envoy, tcp_accepts("127.0.0.1", port), "listener", 30)
    except BaseException:
        envoy.stop()
        raise
    return Gateway(RELAY, f"127.0.0.1:{port}", [envoy])


def smg_binary(venv: Path) -> Path:
    return venv / "bin" / "smg"


def ensure_smg(venv: Path, log_dir: Path) -> Path:
    """SMG from PyPI in its own venv (its dependencies must not touch ours), installed once and cached."""
    binary = smg_binary(venv)
    if binary.exists():
        return binary
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"installing smg=={SMG_VERSION} into {venv} (once; cached)", file=sys.stderr, flush=True)
    with open(log_dir / "smg-install.log", "wb") as log:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=log, stderr=log)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"smg=={SMG_VERSION}"],
            check=True,
            stdout=log,
            stderr=log,
        )
    if not binary.exists():
        raise StartError(f"smg installed but {binary} is missing; see {log_dir / 'smg-install.log'}")
    return binary


def start_smg(
    binary: Path, engines: list[str], model_dir: Path, model: str, log_dir: Path, timeout_s: float = 90.0
) -> Gateway:
    """SMG in gRPC mode on the same engines, with the same tokenizer and chat template as ours."""
    port, metrics_port = free_port(), free_port()
    argv = [str(binary), "launch", "--worker-urls", *(f"grpc://{a}" for a in engines)]
    argv += ["--model-path", str(model_dir), "--chat-template", str(model_dir / "chat_template.jinja")]
    argv += ["--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warn"]
    # Hermes calls, as ours parses them for the tool-stream workload (SMG's name for Hermes is `qwen`).
    argv += ["--tool-call-parser", "qwen"]
    child = spawn("smg", argv, log_dir, env={**SMG_ENV, "NO_COLOR": "1"})
    gateway = Gateway("smg", f"http://127.0.0.1:{port}", [child])
    try:
        _wait_chat(gateway, model, timeout_s)
    except BaseException:
        gateway.stop()
        raise
    return gateway


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
