"""`extproc up`: the whole local stack (simulated engines, extproc, Envoy) as supervised child processes.

This module composes the stack: which children run, in which order, with which ports, flags and generated
configs, what "ready" and "alive" mean for each, which restart and how they stop. extproc.supervisor runs
them: children start one after another, each awaited until ready.

Lifecycle (docs/operating.md, "Lifecycle"): a simulator or extproc that dies is restarted with backoff
(Envoy answers 503 meanwhile), and extproc is killed and restarted when it stops answering gRPC calls;
Envoy's death stops the stack with a non-zero exit. SIGTERM or Ctrl-C drains: Envoy stops accepting
connections, extproc lets open requests finish for the shutdown grace and then cuts the rest (aborting
their engine requests), then Envoy and the engines stop, and `up` exits 0. A second signal stops at once.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from extproc import envoy_bootstrap, models
from extproc.config import (
    ConfigError,
    ServedModel,
    Settings,
    engine_address,
    models_toml,
    served_models,
    settings_to_flags,
)
from extproc.discovery.targets import is_static
from extproc.setting_parsers import EngineConfig, parse_host_port
from extproc.settings import CONFIG_ENV, SETTINGS
from extproc.supervisor import (
    ChildSpec,
    Interrupted,
    Liveness,
    RestartPolicy,
    StackError,
    Supervisor,
    connect_host,
    exit_text,
    grpc_answers,
    http_ok,
    stop_on_signals,
    tcp_accepts,
    unix_accepts,
)

SIM_HOST = "127.0.0.1"
SERVER = "server"
ENVOY = "envoy"
# extproc and the simulators restart when they die; Envoy has no policy (see envoy_spec).
RESTART = RestartPolicy(first_delay_s=0.5, max_delay_s=30.0, stable_after_s=30.0)
LIVENESS_FAILURES = 3
# After the shutdown grace, extproc needs a moment to cut the streams left (1 s), have their aborts
# answered (up to 2.5 s) and close its engine pools.
SERVER_STOP_MARGIN_S = 10.0


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Fail early and clearly; otherwise a readiness probe could succeed against someone else's server."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers do not count as busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host != "localhost" else "127.0.0.1", port))
        except OSError as exc:
            raise StackError(f"{what} {host}:{port} is not available: {exc.strerror}") from None


# --- the stack ----------------------------------------------------------------------------------------------


def run_dir_for(settings: Settings) -> Path:
    """One directory per client port: bootstrap and child logs of the latest run stay there to read."""
    path = models.cache_root() / "run" / str(settings.port)
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir_for(settings: Settings) -> Path:
    """`state_dir`, or the per-user state folder of the XDG base directories (state, not cache: a user
    clears caches freely, and stored conversations are not regenerated)."""
    if settings.state_dir is not None:
        return Path(settings.state_dir)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "extproc"


def up_responses_store(settings: Settings) -> str:
    """The store `up` gives extproc: the one configured, else SQLite in the state directory, so that
    stored responses and conversations survive a restart of the stack."""
    if settings.responses_store is not None:
        return settings.responses_store
    return f"sqlite:{state_dir_for(settings) / 'responses.db'}"


def prepare_store_dir(store: str) -> None:
    """Creates the folder of a SQLite store (SQLite creates the file, not its folder)."""
    if store.startswith("sqlite:"):
        Path(store.removeprefix("sqlite:")).expanduser().parent.mkdir(parents=True, exist_ok=True)


def child_env() -> dict[str, str]:
    """Our environment minus the settings layers: children get every setting as an explicit flag."""
    drop = {CONFIG_ENV, *(s.env for s in SETTINGS if s.env is not None)}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONUNBUFFERED"] = "1"  # line-by-line logs through our pipe
    return env


@dataclass(frozen=True)
class SimPlan:
    """Simulated engines `up` starts for a model configured without engines."""

    model: ServedModel
    first_port: int

    @property
    def ports(self) -> range:
        return range(self.first_port, self.first_port + self.model.sim)

    @property
    def engines(self) -> tuple[EngineConfig, ...]:
        return tuple(EngineConfig(f"grpc://{SIM_HOST}:{p}", self.model.sim_protocol) for p in self.ports)


def plan_sims(served: tuple[ServedModel, ...], sim_port: int) -> list[SimPlan]:
    """Consecutive port ranges from `sim_port`, one per model without engines, in configuration order."""
    plans: list[SimPlan] = []
    port = sim_port
    for model in served:
        if model.engines:
            continue
        if model.sim < 1:
            raise StackError(f"model {model.name!r} has no engines and --sim is 0: nothing would serve it")
        plans.append(SimPlan(model, port))
        port += model.sim
    return plans


def _url_host(host: str) -> str:
    host = connect_host(host)
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def check_ports(settings: Settings, sims: list[SimPlan]) -> None:
    """Distinct and free ports for everything this stack will listen on."""
    wanted: list[tuple[str, int, str]] = [
        (settings.host, settings.port, "--port"),
        ("127.0.0.1", settings.admin_port, "--admin-port"),
    ]
    if not settings.listen.startswith("unix:"):
        host, port = parse_host_port(settings.listen)
        wanted.append((host, port, "--listen"))
    if settings.metrics_port:
        wanted.append((settings.metrics_host, settings.metrics_port, "--metrics-port"))
    if sims:
        last = sims[-1].ports[-1]
        if last > 65535:
            count = sum(len(plan.ports) for plan in sims)
            raise StackError(f"--sim-port {settings.sim_port} leaves no room for {count} engines")
        wanted += [(SIM_HOST, port, "--sim-port range") for plan in sims for port in plan.ports]
    seen: dict[int, str] = {}
    for _, port, what in wanted:
        if port in seen:
            raise StackError(f"{what} uses port {port}, which {seen[port]} already uses")
        seen[port] = what
    for host, port, what in wanted:
        ensure_port_free(host, port, f"{what} address")


def check_script(path: str) -> None:
    """A bad scripted-outputs file stops `up` before anything starts, not a simulator after."""
    from extproc.simulator.script import load_script_arg

    try:
        load_script_arg(f"@{path}")
    except (OSError, ValueError) as e:
        raise StackError(f"sim_script {path}: {e}") from None


def _sim_spec(plan: SimPlan, name: str, env: dict[str, str], script: str | None) -> ChildSpec:
    model = plan.model
    argv = [sys.executable, "-m", "extproc.simulator", "--host", SIM_HOST, "--port", str(plan.first_port)]
    argv += ["--engines", str(model.sim), "--model-dir", str(model.model_dir), "--model-name", model.name]
    argv += ["--protocol", model.sim_protocol]
    if script:
        argv += ["--script", f"@{script}"]
    probes = [tcp_accepts(SIM_HOST, port) for port in plan.ports]
    desc = f"ports {plan.ports[0]}-{plan.ports[-1]} accepting"
    return ChildSpec(name, argv, lambda: all(p() for p in probes), desc, env, restart=RESTART)


def _child_name(model: str) -> str:
    """`sim-<model>`, safe as a log file name."""
    return "sim-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("._") or "model")


def stack_specs(
    settings: Settings, run_dir: Path
) -> tuple[list[ChildSpec], tuple[ServedModel, ...], list[SimPlan]]:
    """The children to start, in order; the models extproc serves (engines filled in); the simulators."""
    env = child_env()
    specs: list[ChildSpec] = []
    served = served_models(settings)
    sims = plan_sims(served, settings.sim_port)
    filled = {plan.model.name: plan.engines for plan in sims}
    served = tuple(replace(m, engines=filled.get(m.name, m.engines)) for m in served)
    settings = replace(settings, responses_store=up_responses_store(settings))
    if settings.response_path == "module" and settings.module_stop_file is None:
        # Past the shutdown grace, extproc creates it and Envoy's module ends its answers (extproc
        # removes a stale one when it starts, before Envoy).
        settings = replace(settings, module_stop_file=str(run_dir / "module-stop"))
    if sims and settings.engine_tls_ca:
        raise StackError(
            "engine_tls_ca is for engines given with --engine: the simulators `up` starts serve plaintext"
        )
    if settings.listen_tls_cert and not settings.extproc_tls_ca:
        raise StackError(
            "listen_tls_cert needs extproc_tls_ca: the CA Envoy verifies extproc's certificate with"
        )
    if settings.listen_tls_client_ca and not settings.extproc_tls_cert:
        raise StackError(
            "listen_tls_client_ca needs extproc_tls_cert and extproc_tls_key: Envoy's certificate"
        )
    if sims and settings.sim_script:
        check_script(settings.sim_script)
    for plan in sims:
        name = "sim" if len(sims) == 1 else _child_name(plan.model.name)
        specs.append(_sim_spec(plan, name, env, settings.sim_script))

    common = ("listen", "max_body_bytes", "log_level", "load_interval", "kv_events", "shutdown_grace")
    common = (*common, "api_keys_file", "max_buffered_output_tokens", "request_workers", "responses_store")
    common = (*common, "first_token_timeout", "inter_token_timeout", "responses_mcp_max_rounds")
    common = (*common, "listen_tls_cert", "listen_tls_key", "listen_tls_client_ca")
    common = (*common, "engine_tls_ca", "engine_tls_cert", "engine_tls_key", "engine_tls_server_name")
    common = (*common, "metrics_host", "metrics_port")
    common = (*common, "dns_refresh_interval", "kubernetes_api", "kubernetes_token_file")
    common = (*common, "kubernetes_ca_file", "xds_listen", "destination_fallbacks", "module_stop_file")
    # The fallbacks extproc lists must match the retries `up` gives Envoy (envoy_spec), for every model.
    fallbacks = known_engines(served, settings.xds_listen is not None)[1]
    settings = replace(settings, destination_fallbacks=fallbacks)
    if settings.models:
        # Tables have no flag form: the server reads the resolved models from a file of their own.
        models_file = run_dir / "models.toml"
        models_file.write_text(models_toml(served))
        argv = [sys.executable, "-m", "extproc", "serve", "--config", str(models_file)]
        argv += settings_to_flags(settings, common)
    else:
        (model,) = served
        single = replace(
            settings,
            model_dir=model.model_dir,
            model_name=model.name,
            engines=tuple(e.url for e in model.engines),
            engine_protocol=model.engine_protocol,
            routing_config=model.routing_config,
        )
        fields = (*common, "model_dir", "model_name", "engines", "routing_policy", "routing_config")
        fields = (*fields, "engine_protocol")
        argv = [sys.executable, "-m", "extproc", "serve", *settings_to_flags(single, fields)]
    specs.append(server_spec(settings, argv, env))
    specs.append(envoy_spec(settings, served, run_dir, env))
    return specs, served, sims


def server_spec(settings: Settings, argv: list[str], env: dict[str, str]) -> ChildSpec:
    """extproc serve: ready when its port accepts, alive while it answers gRPC calls, restarted when it
    dies or hangs; it stops last but one of its own accord (its streams drain through Envoy)."""
    socket_path = envoy_bootstrap.unix_socket_path(settings.listen)
    if socket_path is not None:
        probe, desc = unix_accepts(socket_path), f"{socket_path} accepting"
        target = f"unix:{socket_path}"
    else:
        host, port = parse_host_port(settings.listen)
        probe, desc = tcp_accepts(host, port), f"{settings.listen} accepting"
        target = f"{_url_host(host)}:{port}"
    liveness = None
    if settings.liveness_interval > 0:
        check = f"a gRPC call on {settings.listen}"
        tls = None
        if settings.listen_tls_cert and settings.extproc_tls_ca:
            from extproc.grpc_tls import ClientTls  # grpc: only once `up` runs

            # The probe speaks TLS as Envoy does, with Envoy's client certificate where extproc wants one.
            tls = ClientTls(settings.extproc_tls_ca, settings.extproc_tls_cert, settings.extproc_tls_key)
        liveness = Liveness(grpc_answers(target, tls), settings.liveness_interval, check, LIVENESS_FAILURES)
    stop_timeout = settings.shutdown_grace + SERVER_STOP_MARGIN_S
    return ChildSpec(SERVER, argv, probe, desc, env, RESTART, liveness, stop_timeout)


def envoy_spec(
    settings: Settings, served: tuple[ServedModel, ...], run_dir: Path, env: dict[str, str]
) -> ChildSpec:
    """Envoy, with no restart policy: it holds every client connection, so its death has already cut
    them all, and while it is down clients get connection refused whatever we do. A crash of Envoy is
    a bug or a bad configuration, not a fault to ride out; the stack exits non-zero so that whoever
    runs `up` (systemd, Kubernetes) sees it and restarts the whole stack."""
    bootstrap = run_dir / "envoy.json"
    engines, fallbacks = known_engines(served, settings.xds_listen is not None)
    options = envoy_options(settings, engines, None if engines else fallbacks)
    bootstrap.write_text(envoy_bootstrap.render_bootstrap(options))
    envoy_bootstrap.validate_config(bootstrap)
    argv = [envoy_bootstrap.envoy_binary(), "-c", str(bootstrap), "--log-level", settings.envoy_log_level]
    # No shared-memory hot-restart state, so several stacks (and other Envoys) can run side by side.
    argv += ["--disable-hot-restart"]
    # Once draining, every connection is told at once to close after its current request.
    argv += ["--drain-strategy", "immediate"]
    admin = f"http://127.0.0.1:{settings.admin_port}"
    ready_url = f"{admin}/ready"
    return ChildSpec(
        ENVOY, argv, http_ok(ready_url), f"GET {ready_url} returning 200", env, drain=envoy_drain(admin)
    )


def envoy_drain(admin_url: str) -> Callable[[], None]:
    """Envoy stops taking new work but keeps serving what is open: failing its health check starts its
    drain sequence (responses carry `connection: close`, HTTP/2 clients get GOAWAY), and stopping its
    listeners refuses new connections."""

    def drain() -> None:
        for path in ("/healthcheck/fail", "/drain_listeners"):
            request = urllib.request.Request(admin_url + path, method="POST", data=b"")
            with urllib.request.urlopen(request, timeout=2.0) as resp:
                resp.read()

    return drain


def describe(served: tuple[ServedModel, ...], sims: list[SimPlan]) -> str:
    """What the stack serves, for the announcement: "model m, 2 simulated engines" or, for several,
    "models a (2 simulated engines), b (1 engine)"."""
    simulated = {plan.model.name for plan in sims}

    def engines(model: ServedModel) -> str:
        found = [e.url for e in model.engines if not is_static(e.url)]
        n = len(model.engines) - len(found)
        kind = "simulated engine" if model.name in simulated else "engine"
        parts = [f"{n} {kind}" + ("" if n == 1 else "s")] if n or not found else []
        if found:
            parts.append("engines from " + ", ".join(found))
        return " and ".join(parts)

    if len(served) == 1:
        return f"model {served[0].name}, {engines(served[0])}"
    return "models " + ", ".join(f"{m.name} ({engines(m)})" for m in served)


# Fallback engines `up` lists after the primary (and Envoy retries) when its Envoy knows the engines.
UP_FALLBACKS = 2


def known_engines(served: tuple[ServedModel, ...], eds: bool = False) -> tuple[tuple[str, ...], int]:
    """The engines `up` tells Envoy about (every model's, one cluster) and the fallbacks extproc then
    lists: up to UP_FALLBACKS of the request's own model. Each request carries Envoy's retry limit (one
    per listed fallback), so Envoy never goes past the list to an engine of another model.

    With any engine discovered at run time (a DNS name, a Kubernetes Service) Envoy cannot list them:
    none are known to it (ORIGINAL_DST, one address per request) and there are no fallbacks, unless
    extproc serves them over EDS (`eds`), where UP_FALLBACKS are followed."""
    urls = [e.url for model in served for e in model.engines]
    if not all(is_static(url) for url in urls):
        return (), UP_FALLBACKS if eds else 0
    addresses = tuple(engine_address(url) for url in urls)
    return addresses, up_fallbacks(max((len(model.engines) for model in served), default=0))


def up_fallbacks(engines: int) -> int:
    """Fallbacks (and Envoy retries) `up` uses for `engines` engines: the others, at most UP_FALLBACKS."""
    return min(UP_FALLBACKS, max(engines - 1, 0))


def envoy_options(
    settings: Settings, engines: tuple[str, ...] = (), retries: int | None = None
) -> envoy_bootstrap.EnvoyOptions:
    """`engines` known to Envoy (override_host) get `retries` attempts after the first (default: one per
    fallback `up` lists); none means ORIGINAL_DST. With `xds_listen`, the engines cluster is EDS from
    extproc instead (override_host over every engine extproc knows), with `retries` too."""
    if retries is None:
        retries = up_fallbacks(len(engines))
    xds = settings.xds_listen
    return envoy_bootstrap.EnvoyOptions(
        listen_host=settings.host,
        listen_port=settings.port,
        admin_port=settings.admin_port,
        extproc_target=settings.listen,
        max_request_bytes=settings.max_body_bytes,
        access_log=settings.envoy_access_log,
        engines=() if xds else engines,
        engines_xds=xds,
        engine_retries=retries if engines or xds else 0,
        **envoy_bootstrap.edge_options(settings),
    )


def hangup_forwarder(supervisor: Supervisor) -> Callable[[int, object], None]:
    """A SIGHUP handler for `up`: the signal goes to extproc (it re-reads its API keys file) instead of
    ending the stack."""

    def on_hangup(signum: int, frame: object) -> None:
        for child in supervisor.children:
            if child.name == SERVER and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGHUP)

    return on_hangup


def _say(out: IO[str], text: str) -> None:
    try:
        out.write(text + "\n")
        out.flush()
    except (OSError, ValueError):
        pass


def run_stack(settings: Settings, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Run the stack in the foreground until a signal (drain, exit 0) or Envoy's death (exit 1)."""
    out = out or sys.stdout
    err = err or sys.stderr
    with stop_on_signals() as stop:
        supervisor: Supervisor | None = None
        previous_hangup: Any = None
        try:
            check_ports(settings, plan_sims(served_models(settings), settings.sim_port))
            run_dir = run_dir_for(settings)
            prepare_store_dir(up_responses_store(settings))
            settings, why = envoy_bootstrap.choose_response_path(settings)
            _say(err, f"extproc: response path: {settings.response_path} ({why})")
            specs, served, sims = stack_specs(settings, run_dir)
            supervisor = Supervisor(
                run_dir,
                stop.requested,
                echo=err,
                urgent=stop.urgent,
                startup_timeout_s=settings.startup_timeout,
            )
            previous_hangup = signal.signal(signal.SIGHUP, hangup_forwarder(supervisor))
            for spec in specs:
                supervisor.start(spec, settings.startup_timeout)
            url = f"http://{_url_host(settings.host)}:{settings.port}/v1"
            _say(out, f"extproc: serving {url} ({describe(served, sims)})")
            dead = supervisor.watch()
            if dead is not None:
                _say(
                    err,
                    f"extproc: {dead.name} {exit_text(dead.proc.returncode)}; "
                    f"stopping the stack (log: {run_dir / dead.name}.log):\n{dead.tail_text()}",
                )
                return 1
            _say(
                err,
                f"extproc: draining: open requests get {settings.shutdown_grace:g}s to finish "
                "(a second Ctrl-C stops at once)",
            )
            return 0
        except Interrupted:
            return 0
        except ConfigError as exc:
            _say(err, f"extproc: {exc}")
            return 2
        except (StackError, envoy_bootstrap.EnvoyConfigError, FileNotFoundError, ValueError) as exc:
            _say(err, f"extproc: {exc}")
            return 1
        finally:
            if previous_hangup is not None:
                signal.signal(signal.SIGHUP, previous_hangup)
            if supervisor is not None:
                # extproc first: its open streams finish through Envoy, which still serves them; then
                # Envoy; the engines last, so that the aborts of cut streams reach them.
                supervisor.stop_all(order=(SERVER, ENVOY))
