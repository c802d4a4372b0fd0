"""The `extproc` command: `up` (the local stack), `serve` (the ext_proc server alone), `envoy-config`,
`keys hash` (a line of the API keys file, extproc.api_keys).

Each command's flags are derived from the settings it takes (extproc.settings); they are parsed as strings
and validated by extproc.config, so a bad value reads the same whether it came from a flag, the environment
or the config file. Heavy modules (the server, the Rust extension) are imported only by the command that
needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from extproc import __version__
from extproc.config import ConfigError, engine_address, load_settings
from extproc.discovery.targets import is_static
from extproc.settings import (
    CONFIG_ENV,
    ENVOY_CONFIG,
    MODEL_SETTINGS,
    SERVE,
    SETTINGS_BY_NAME,
    UP,
    Settings,
    command_settings,
)

_EPILOG = (
    f"Settings come from defaults < config file (--config or ${CONFIG_ENV}, TOML, keys = setting names "
    "with underscores) < environment (EXTPROC_<SETTING>, e.g. EXTPROC_PORT) < flags. Several models: "
    f"[[models]] tables in the config file ({', '.join(MODEL_SETTINGS)})."
)


def _add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """The command's flags, one per setting it takes (extproc.settings), each parsed later as a string."""
    parser.add_argument("--config", metavar="FILE", help=f"TOML config file (or ${CONFIG_ENV})")
    for setting in command_settings(command):
        kwargs: dict[str, Any] = {"dest": setting.name, "default": None, "metavar": setting.metavar}
        if setting.repeatable:
            kwargs["action"] = "append"
        elif setting.switch:
            kwargs["nargs"] = "?"
            kwargs["const"] = "true"
        assert setting.flag is not None
        parser.add_argument(setting.flag, help=setting.help_line(), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extproc",
        description="An LLM gateway as an Envoy external processor: OpenAI HTTP in, engine gRPC out.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"extproc {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = commands.add_parser(
        UP,
        help="run the local stack: engines (simulated unless --engine), extproc and Envoy",
        description="Run the whole local stack in the foreground; Ctrl-C stops it.",
        epilog=_EPILOG,
    )
    _add_settings(up, UP)

    serve = commands.add_parser(
        SERVE,
        help="run the ext_proc gRPC server alone (next to your own Envoy)",
        description="Run the ext_proc gRPC server; Envoy (see `extproc envoy-config`) must point at it.",
        epilog=_EPILOG,
    )
    _add_settings(serve, SERVE)

    envoy = commands.add_parser(
        ENVOY_CONFIG,
        help="print the Envoy bootstrap (JSON) that fronts an extproc server",
        description="Print the Envoy bootstrap for a gateway whose extproc listens on --listen.",
        epilog=_EPILOG,
    )
    _add_settings(envoy, ENVOY_CONFIG)
    envoy.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")

    keys = commands.add_parser(
        "keys",
        help="API keys: `extproc keys hash` prints the api_keys_file line for a key",
        description="Manage API keys for the api_keys_file setting.",
    )
    from extproc import api_keys

    api_keys.build_parser(keys)

    status = commands.add_parser(
        "status",
        help="show the engines of a running gateway (its /engines view) as a table",
        description="Read GET /engines from a running gateway's metrics port and print it as a table.",
    )
    status.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9464",
        metavar="URL",
        help="the gateway's metrics server (default: %(default)s)",
    )

    # The simulator owns its flags; `extproc sim ARGS` hands ARGS to it unchanged.
    commands.add_parser(
        "sim",
        help="run simulated engines (vLLM or SGLang gRPC protocol); `extproc sim --help` lists the flags",
        add_help=False,
    )
    return parser


def _settings(args: argparse.Namespace, command: str) -> Settings:
    flags = {s.name: getattr(args, s.name) for s in command_settings(command)}
    return load_settings(flags, config_file=args.config)


def _cmd_up(args: argparse.Namespace) -> int:
    settings = _settings(args, UP)
    from extproc.stack import run_stack

    return run_stack(settings)


def _configure_logging(level: str, log_format: str = "text") -> None:
    """Filter extproc's structlog (and stdlib) logs at the configured level; `json`: one JSON object a
    line (with timestamp, level and logger name), for log collectors."""
    import logging

    import structlog

    number = logging.getLevelNamesMapping()[level.upper()]
    logging.basicConfig(level=number, format="%(levelname)s %(name)s: %(message)s")
    if log_format == "json":
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(number),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            logger_factory=structlog.PrintLoggerFactory(),
        )
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(number))


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args, SERVE)
    if settings.models:
        for model in settings.models:
            if not model.engines:
                name = model.served_name()
                raise ConfigError(f"serve needs engines for every model: {name!r} has none (engines = [...])")
    elif not settings.engines:
        engines = SETTINGS_BY_NAME["engines"]
        hint = f"{engines.flag} grpc://host:port (or {engines.env})"
        raise ConfigError(f"serve needs at least one engine: {hint}")
    import asyncio

    _configure_logging(settings.log_level, settings.log_format)
    from extproc.server import serve  # imports the Rust extension: only here

    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_envoy_config(args: argparse.Namespace) -> int:
    from extproc.envoy_bootstrap import DEFAULT_CLIENT_CONNECTIONS, choose_response_path, render_bootstrap
    from extproc.stack import envoy_options

    settings = _settings(args, ENVOY_CONFIG)
    # With engines given, Envoy knows them and follows extproc's fallback list: one retry per fallback
    # `extproc serve --destination-fallbacks N` lists (default: as many as `up` would).
    # Engines discovered at run time (DNS names, Kubernetes Services) cannot be listed: ORIGINAL_DST, or
    # EDS from extproc (`--xds-listen`), which also lets Envoy follow fallbacks.
    discovered = [url for url in settings.engines if not is_static(url)]
    engines = () if discovered else tuple(engine_address(url) for url in settings.engines)
    eds = settings.xds_listen is not None
    if settings.destination_fallbacks and discovered and not eds:
        raise ConfigError(
            f"--destination-fallbacks needs engines Envoy can list: {discovered[0]} is discovered at run "
            "time (serve the engines over EDS with --xds-listen, or Envoy reaches each engine by the "
            "address extproc names, without fallbacks)"
        )
    if settings.destination_fallbacks and not engines and not eds:
        raise ConfigError(
            "--destination-fallbacks needs the engines (--engine): Envoy must know them to follow it"
        )
    retries = settings.destination_fallbacks or (0 if eds and not engines else None)
    # The config is for an Envoy elsewhere: its connection cap is not derived from this machine's
    # open-file limit (see docs/reliability.md).
    cap = settings.max_client_connections or DEFAULT_CLIENT_CONNECTIONS
    settings, why = choose_response_path(settings)
    # The choice goes to stderr: stdout may be the config itself.
    print(f"extproc: response path: {settings.response_path} ({why})", file=sys.stderr)
    options = envoy_options(replace(settings, max_client_connections=None), engines, retries)
    options = replace(options, max_downstream_connections=cap)
    text = render_bootstrap(options)
    if args.output:
        with open(args.output, "w") as file:
            file.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from extproc import api_keys

    return api_keys.run(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from extproc import status

    try:
        engines = status.fetch(args.metrics_url)
    except status.StatusError as e:
        print(f"extproc: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(status.table(engines))
    return 0


_COMMANDS = {
    UP: _cmd_up,
    SERVE: _cmd_serve,
    ENVOY_CONFIG: _cmd_envoy_config,
    "keys": _cmd_keys,
    "status": _cmd_status,
}


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
