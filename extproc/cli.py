"""The `extproc` command: `up` (the local stack), `serve` (the ext_proc server alone), `envoy-config`.

Flags are parsed as strings and validated by extproc.config, so a bad value reads the same whether it came
from a flag, the environment or the config file. Heavy modules (the server, the Rust extension) are imported
only by the command that needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from extproc import __version__
from extproc.config import (
    CONFIG_ENV,
    ENGINE_PROTOCOLS,
    ROUTING_POLICIES,
    ConfigError,
    Settings,
    engine_address,
    env_name,
    flag_name,
    load_settings,
)

_D = Settings()
# Each setting's flag: (field, help). Defaults shown come from Settings.
_HELP: dict[str, str] = {
    "listen": f"ext_proc gRPC address, host:port or unix:/path (default {_D.listen})",
    "model_dir": "model directory with tokenizer.json (default: the bundled Llama 3 tokenizer model)",
    "model_name": "served model name (default: the model directory's name)",
    "engines": "engine endpoint grpc://host:port; repeat or comma-separate for several",
    "max_body_bytes": f"largest request body, bytes or e.g. 8MiB (default {_D.max_body_bytes})",
    "log_level": f"extproc log level: debug, info, warning, error (default {_D.log_level})",
    "routing_policy": f"engine picking policy: {', '.join(ROUTING_POLICIES)} (default {_D.routing_policy})",
    "routing_config": "router settings, a JSON object, e.g. '{\"spill_abs\": 4}' (docs/routing.md)",
    "engine_protocol": (
        f"engines' gRPC protocol: {', '.join(ENGINE_PROTOCOLS)}; auto probes each engine "
        f"(default {_D.engine_protocol})"
    ),
    "kv_events": (
        "engines' KV-event source: grpc (SubscribeKvEvents) or off; a ZMQ publisher is set per engine in "
        f"a [[models]] engine table (default {_D.kv_events})"
    ),
    "load_interval": f"seconds between engine GetLoads polls, 0 for none (default {_D.load_interval:g})",
    "destination_fallbacks": (
        "fallback engines listed after the primary for Envoy's override_host policy; 0 for an ORIGINAL_DST "
        f"engines cluster (default {_D.destination_fallbacks})"
    ),
    "host": f"address Envoy listens on for clients (default {_D.host})",
    "port": f"client HTTP port (default {_D.port})",
    "admin_port": f"Envoy admin port, loopback only (default {_D.admin_port})",
    "sim": f"simulated engines to start when no --engine is given (default {_D.sim})",
    "sim_port": f"first simulated engine's port; engine i uses sim-port+i (default {_D.sim_port})",
    "envoy_log_level": f"Envoy log level: trace ... critical, off (default {_D.envoy_log_level})",
    "startup_timeout": f"seconds to wait for each child to be ready (default {_D.startup_timeout:g})",
    "envoy_access_log": "Envoy logs each request to stdout (default false)",
}

_METAVARS: dict[str, str] = {
    "listen": "ADDR",
    "model_dir": "DIR",
    "model_name": "NAME",
    "engines": "URL",
    "max_body_bytes": "BYTES",
    "log_level": "LEVEL",
    "routing_policy": "POLICY",
    "routing_config": "JSON",
    "engine_protocol": "PROTOCOL",
    "kv_events": "SOURCE",
    "load_interval": "SECONDS",
    "destination_fallbacks": "N",
    "host": "IP",
    "port": "PORT",
    "admin_port": "PORT",
    "sim": "N",
    "sim_port": "PORT",
    "envoy_log_level": "LEVEL",
    "startup_timeout": "SECONDS",
    "envoy_access_log": "BOOL",
}

_SERVE_FIELDS = (
    "listen",
    "model_dir",
    "model_name",
    "engines",
    "max_body_bytes",
    "routing_policy",
    "routing_config",
    "engine_protocol",
    "kv_events",
    "load_interval",
    "destination_fallbacks",
    "log_level",
)
_ENVOY_FIELDS = ("host", "port", "admin_port", "listen", "max_body_bytes", "envoy_access_log", "engines")
_ENVOY_FIELDS = (*_ENVOY_FIELDS, "destination_fallbacks")
_UP_FIELDS = (*_SERVE_FIELDS, "host", "port", "admin_port", "sim", "sim_port", "envoy_log_level")
_UP_FIELDS = (*_UP_FIELDS, "startup_timeout", "envoy_access_log")

_EPILOG = (
    "Settings come from defaults < config file (--config or $EXTPROC_CONFIG, TOML, keys = setting names "
    "with underscores) < environment (EXTPROC_<SETTING>, e.g. EXTPROC_PORT) < flags. Several models: "
    "[[models]] tables in the config file (name, model_dir, engines, routing_policy, engine_protocol, "
    "kv_events, sim)."
)


def _add_settings(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"TOML config file (or ${CONFIG_ENV})")
    for name in names:
        kwargs: dict[str, Any] = {"dest": name, "default": None, "metavar": _METAVARS[name]}
        if name == "engines":
            kwargs["action"] = "append"
        elif name == "envoy_access_log":
            kwargs["nargs"] = "?"
            kwargs["const"] = "true"
        parser.add_argument(flag_name(name), help=f"{_HELP[name]} [{env_name(name)}]", **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extproc",
        description="An LLM gateway as an Envoy external processor: OpenAI HTTP in, engine gRPC out.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"extproc {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = commands.add_parser(
        "up",
        help="run the local stack: engines (simulated unless --engine), extproc and Envoy",
        description="Run the whole local stack in the foreground; Ctrl-C stops it.",
        epilog=_EPILOG,
    )
    _add_settings(up, _UP_FIELDS)

    serve = commands.add_parser(
        "serve",
        help="run the ext_proc gRPC server alone (next to your own Envoy)",
        description="Run the ext_proc gRPC server; Envoy (see `extproc envoy-config`) must point at it.",
        epilog=_EPILOG,
    )
    _add_settings(serve, _SERVE_FIELDS)

    envoy = commands.add_parser(
        "envoy-config",
        help="print the Envoy bootstrap (JSON) that fronts an extproc server",
        description="Print the Envoy bootstrap for a gateway whose extproc listens on --listen.",
        epilog=_EPILOG,
    )
    _add_settings(envoy, _ENVOY_FIELDS)
    envoy.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")

    # The simulator owns its flags; `extproc sim ARGS` hands ARGS to it unchanged.
    commands.add_parser(
        "sim",
        help="run simulated engines (vLLM or SGLang gRPC protocol); `extproc sim --help` lists the flags",
        add_help=False,
    )
    return parser


def _settings(args: argparse.Namespace, names: Sequence[str]) -> Settings:
    return load_settings({name: getattr(args, name) for name in names}, config_file=args.config)


def _cmd_up(args: argparse.Namespace) -> int:
    settings = _settings(args, _UP_FIELDS)
    from extproc.stack import run_stack

    return run_stack(settings)


def _configure_logging(level: str) -> None:
    """Filter extproc's structlog (and stdlib) logs at the configured level."""
    import logging

    import structlog

    number = logging.getLevelNamesMapping()[level.upper()]
    logging.basicConfig(level=number, format="%(levelname)s %(name)s: %(message)s")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(number))


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args, _SERVE_FIELDS)
    if settings.models:
        for model in settings.models:
            if not model.engines:
                name = model.served_name()
                raise ConfigError(f"serve needs engines for every model: {name!r} has none (engines = [...])")
    elif not settings.engines:
        hint = f"--engine grpc://host:port (or {env_name('engines')})"
        raise ConfigError(f"serve needs at least one engine: {hint}")
    import asyncio

    _configure_logging(settings.log_level)
    from extproc.server import serve  # imports the Rust extension: only here

    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_envoy_config(args: argparse.Namespace) -> int:
    from extproc.envoy_bootstrap import render_bootstrap
    from extproc.stack import envoy_options

    settings = _settings(args, _ENVOY_FIELDS)
    # With engines given, Envoy knows them and follows extproc's fallback list: one retry per fallback
    # `extproc serve --destination-fallbacks N` lists (default: as many as `up` would).
    engines = tuple(engine_address(url) for url in settings.engines)
    if settings.destination_fallbacks and not engines:
        raise ConfigError(
            "--destination-fallbacks needs the engines (--engine): Envoy must know them to follow it"
        )
    retries = settings.destination_fallbacks or None
    text = render_bootstrap(envoy_options(settings, engines, retries))
    if args.output:
        with open(args.output, "w") as file:
            file.write(text)
    else:
        sys.stdout.write(text)
    return 0


_COMMANDS = {"up": _cmd_up, "serve": _cmd_serve, "envoy-config": _cmd_envoy_config}


def _cmd_sim(argv: Sequence[str]) -> int:
    from extproc.simulator.__main__ import main as simulator_main

    try:
        return simulator_main(list(argv))
    except SystemExit as exc:  # --help and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:
        return _cmd_sim(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: return, don't exit, for callers' sake
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"extproc: {exc}", file=sys.stderr)
        return 2
