"""Every setting of the `extproc` commands, each declared once, as a field of `Settings`: its name (also its
TOML key), type, default, parser, help, flag, environment variable, the commands that take it, and its key
in `[[models]]` tables where a model may set its own.

Everything else is derived from these declarations (`SETTINGS`): the flags of each command (extproc.cli),
the config file, environment and flag layers (extproc.config), the environment a child of `extproc up`
must not inherit (extproc.stack), and the settings tables in docs/operating.md, which `make docs` rewrites
and a test compares with the committed file:

    python -m extproc.settings --markdown              # print the tables
    python -m extproc.settings --write docs/operating.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from extproc import models as model_files
from extproc import setting_parsers as p
from extproc.setting_parsers import EngineConfig

CONFIG_ENV = "EXTPROC_CONFIG"
ENV_PREFIX = "EXTPROC_"

UP = "up"
SERVE = "serve"
ENVOY_CONFIG = "envoy-config"
COMMANDS = (UP, SERVE, ENVOY_CONFIG)

_ALL = COMMANDS
_GATEWAY = (UP, SERVE)
_ENVOY = (UP, ENVOY_CONFIG)

Parser = Callable[[Any], Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Setting:
    """One setting as every layer sees it."""

    # The `Settings` field, which is also the TOML key.
    name: str
    default: Any
    # Raw value (flag or environment string, TOML value) -> typed value; None for `models`, whose tables
    # extproc.config parses knowing the file they are in.
    parse: Parser | None
    # The commands that take it (as a flag; a config file may hold any setting).
    commands: tuple[str, ...]
    # One line of plain text for --help.
    help: str
    # Flag argument name; None: the setting lives only in config files (no flag, no environment variable).
    metavar: str | None = None
    # Markdown for the settings table of docs/operating.md; empty: `help`.
    doc: str = ""
    # The default in words, where the value itself says nothing (None, or computed at startup).
    default_doc: str | None = None
    # The flag when it is not `--` + the name with dashes.
    flag_override: str | None = None
    # Its key in a `[[models]]` table, where a model may set its own; None: global only.
    model_key: str | None = None
    # The parser for the `[[models]]` key when it takes more than the global form.
    model_parse: Parser | None = None
    # Markdown for the `[[models]]` keys table; empty: "as above".
    model_doc: str = ""
    # A setting of the one model served without `[[models]]` tables, which replace it.
    single_model: bool = False

    @property
    def file_only(self) -> bool:
        return self.metavar is None

    @property
    def flag(self) -> str | None:
        if self.file_only:
            return None
        return self.flag_override or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str | None:
        return None if self.file_only else ENV_PREFIX + self.name.upper()

    @property
    def repeatable(self) -> bool:
        """A list flag, given once per item (each may also be a comma list)."""
        return isinstance(self.default, tuple)

    @property
    def switch(self) -> bool:
        """A boolean flag, on when given without a value."""
        return isinstance(self.default, bool)

    def default_text(self) -> str | None:
        """The default as a user would type it; None when there is none to show."""
        if self.default_doc is not None:
            return self.default_doc
        if self.default is None or self.default == ():
            return None
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

    def help_line(self) -> str:
        """What --help shows."""
        default = self.default_text()
        shown = self.help if default is None else f"{self.help} (default: {default})"
        return f"{shown} [{self.env}]"


_META = "extproc.setting"


def setting(
    default: T,
    parse: Parser | None,
    commands: tuple[str, ...],
    help: str,
    metavar: str | None = None,
    **details: Any,
) -> T:
    """Declares a `Settings` field: its default plus everything the layers need (see `Setting`)."""
    declared = Setting("", default, parse, commands, help, metavar, **details)
    return field(default=default, metadata={_META: declared})


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` table of the config file; None means "the global setting". Its fields are the
    `model_key`s of the settings (checked below)."""

    name: str | None = None
    model_dir: Path | None = None
    engines: tuple[EngineConfig, ...] = ()
    routing_policy: str | None = None
    routing_config: str | None = None
    engine_protocol: str | None = None
    sim: int | None = None
    # "grpc" or "off" for the engines that do not name their own source.
    kv_events: str | None = None
    tool_parser: str | None = None
    reasoning_parser: str | None = None

    def served_name(self) -> str:
        """The name clients ask for, without touching the disk."""
        if self.name:
            return self.name
        return self.model_dir.name if self.model_dir is not None else model_files.DEFAULT_MODEL_NAME


_DEFAULT_MODEL = "the bundled Llama 3 tokenizer model"


@dataclass(frozen=True)
class Settings:
    """Every setting's typed value; each field declares its setting."""

    listen: str = setting(
        "127.0.0.1:50051",
        p.parse_listen,
        _ALL,
        "ext_proc gRPC address, host:port or unix:/path",
        "ADDR",
        doc="ext_proc gRPC address: `host:port`, `[v6]:port` or `unix:/abs/path.sock`",
    )
    engines: tuple[str, ...] = setting(
        (),
        p.parse_engines,
        _ALL,
        "engines: grpc://IP:port, grpc://dns-name:port (every address, re-resolved) or "
        "k8s://[namespace/]service[:port] (the Service's EndpointSlices, watched); repeat or comma-separate",
        "URL",
        doc="where the engines are: `grpc://IP:port` (one engine; `localhost` means 127.0.0.1), "
        "`grpc://dns-name:port` (every A/AAAA address of the name, re-resolved every "
        "`dns_refresh_interval`) or `k8s://[namespace/]service[:port]` (the ready endpoints of a Kubernetes "
        "Service, watched; `port` a port name or number); see [discovery.md](discovery.md). `up` without "
        "engines starts the simulator; `serve` requires at least one; `envoy-config` puts fixed IPs in a "
        "STATIC engines cluster, and uses ORIGINAL_DST when any engine is discovered",
        flag_override="--engine",
        model_key="engines",
        model_parse=p.parse_model_engines,
        model_doc='`"grpc://IP:port"` (or any form above) or `{ url = "...", protocol = "auto" \\| "vllm" '
        '\\| "sglang", kv_events = "grpc" \\| "off" \\| "zmq://..." }` (`protocol` and `kv_events` '
        "optional; a ZMQ publisher only for a `grpc://IP:port` engine)",
        single_model=True,
    )
    dns_refresh_interval: float = setting(
        5.0,
        p.parse_seconds,
        _GATEWAY,
        "seconds between resolutions of engines given by DNS name",
        "SECONDS",
        doc="how often the names of `grpc://dns-name:port` engines are resolved again: addresses that "
        "appear become engines (probed before they take traffic), those that disappear are dropped",
    )
    kubernetes_api: str | None = setting(
        None,
        p.parse_http_url,
        _GATEWAY,
        "Kubernetes API server for k8s:// engines (default: in-cluster)",
        "URL",
        doc="the Kubernetes API server `k8s://` engines are watched on, e.g. `http://127.0.0.1:8001` "
        "(`kubectl proxy`); in a pod, the default finds it from `KUBERNETES_SERVICE_HOST`/`_PORT` with the "
        "pod's service-account token and CA",
        default_doc="in-cluster",
    )
    kubernetes_token_file: str | None = setting(
        None,
        p.parse_file,
        _GATEWAY,
        "bearer token file for the Kubernetes API (re-read on every connection)",
        "FILE",
        doc="the bearer token sent to the Kubernetes API, re-read at every connection (projected tokens "
        "rotate)",
        default_doc="the service-account token when it exists",
    )
    kubernetes_ca_file: str | None = setting(
        None,
        p.parse_file,
        _GATEWAY,
        "PEM CA bundle the Kubernetes API's certificate is verified against",
        "FILE",
        doc="the PEM CA bundle an `https` Kubernetes API is verified against",
        default_doc="the service-account CA when it exists, else the system's",
    )
    # `setting` returns a dataclasses.field (which ruff cannot see); a Path default would be immutable too.
    xds_listen: str | None = setting(
        None,
        p.parse_xds_listen,
        _ALL,
        "extproc serves Envoy's engines cluster over EDS on this host:port (envoy-config: where Envoy finds "
        "it)",
        "ADDR",
        doc="extproc serves the engines cluster over EDS (xDS, plaintext gRPC) on this `host:port`: every "
        "engine it knows, discovered ones included, so that Envoy's override_host policy can follow "
        "`destination_fallbacks` with discovered engines; `envoy-config` and `up` then make the engines "
        "cluster EDS from here; see [discovery.md](discovery.md#envoy)",
        default_doc="off (ORIGINAL_DST for discovered engines)",
    )
    model_dir: Path | None = setting(  # noqa: RUF009
        None,
        p.parse_model_dir,
        _GATEWAY,
        "model directory with tokenizer.json",
        "DIR",
        doc="must exist and contain `tokenizer.json`",
        default_doc=_DEFAULT_MODEL,
        model_key="model_dir",
        model_doc="as `model_dir` above; relative to the file",
        single_model=True,
    )
    model_name: str | None = setting(
        None,
        p.parse_name,
        _GATEWAY,
        "served model name",
        "NAME",
        doc="the `model` clients ask for",
        default_doc="the directory's name",
        model_key="name",
        model_doc="the `model` clients ask for",
        single_model=True,
    )
    max_body_bytes: int = setting(
        8 * p.MiB,
        p.parse_size,
        _ALL,
        "largest request body, bytes or e.g. 8MiB",
        "BYTES",
        doc="largest request body (413 above it); accepts `8MiB`, `512KiB`, `1GiB`; also sizes Envoy's "
        "per-connection buffers",
    )
    max_buffered_output_tokens: int = setting(
        1 << 18,
        p.parse_token_count,
        _GATEWAY,
        "largest non-streamed answer a request may ask for: prompts x n x max_tokens x (top_logprobs + 1)",
        "TOKENS",
        doc="a non-streamed answer is held whole in extproc's memory: a request that could make it larger "
        "than this many tokens (prompts, `n`, `max_tokens` and `top_logprobs` + 1 multiplied; without "
        "`max_tokens`, the context length) is refused with a 400 naming `max_tokens` and the limit before "
        "any engine call; see [reliability.md](reliability.md)",
    )
    request_workers: int = setting(
        0,
        p.parse_count,
        _GATEWAY,
        "threads that parse, template and tokenize large request bodies; 0 for one per CPU",
        "N",
        doc="threads that parse, template and tokenize request bodies of 32 KiB and more, off the threads "
        "serving Envoy's connection, so a huge prompt never stalls other requests; 0: one per CPU; see "
        "[reliability.md](reliability.md)",
    )
    routing_policy: str = setting(
        p.DEFAULT_ROUTING_POLICY,
        p.choice(p.ROUTING_POLICIES),
        _GATEWAY,
        f"engine picking policy: {', '.join(p.ROUTING_POLICIES)}",
        "POLICY",
        doc="how an engine is picked: `kv_events` (cache affinity from the engines' KV events, least load "
        "otherwise), `prefix_cache` (affinity learned from the gateway's own decisions), `weighted`, "
        "`round_robin`, `random`, `least_load`, `power_of_two`, `consistent_hash` (on the `x-session-id` "
        "header or the request's `user`); see [routing.md](routing.md)",
        model_key="routing_policy",
    )
    engine_protocol: str = setting(
        "auto",
        p.choice(p.ENGINE_PROTOCOLS),
        _GATEWAY,
        f"engines' gRPC protocol: {', '.join(p.ENGINE_PROTOCOLS)}; auto probes each engine",
        "PROTOCOL",
        doc="the engines' gRPC protocol: `auto` (probe each engine, see [Engine "
        "protocols](#engine-protocols)), `vllm` or `sglang`",
        model_key="engine_protocol",
    )
    kv_events: str = setting(
        "grpc",
        p.parse_kv_events,
        _GATEWAY,
        "engines' KV-event source: grpc (SubscribeKvEvents) or off; a ZMQ publisher is set per engine in "
        "a [[models]] engine table",
        "SOURCE",
        doc="where engines' KV-cache events come from, for engines that do not name their own: `grpc` "
        "(`SubscribeKvEvents`) or `off`; see [KV events](#kv-events) (vLLM's ZMQ publisher is set per "
        "engine)",
        model_key="kv_events",
        model_doc="`grpc` or `off` for its engines without their own, see [KV events](#kv-events)",
    )
    tool_parser: str = setting(
        "auto",
        p.parse_parser_name,
        _GATEWAY,
        "tool-call format of chat answers: a parser name, none, or auto (inferred from the model name and "
        "chat template)",
        "NAME",
        doc="how tool calls are read from chat answers into `message.tool_calls`: a format name (table in "
        "[agents.md](agents.md)), `none` (calls stay text), or `auto` (inferred from the model's name and "
        "chat template); unknown names are refused at startup",
        model_key="tool_parser",
    )
    reasoning_parser: str = setting(
        "auto",
        p.parse_parser_name,
        _GATEWAY,
        "reasoning format of chat answers: a parser name, none, or auto (inferred from the model name and "
        "chat template)",
        "NAME",
        doc="how reasoning is read from chat answers into `reasoning_content`: a format name (table in "
        "[agents.md](agents.md)), `none`, or `auto` (inferred from the model's name and chat template)",
        model_key="reasoning_parser",
    )
    load_interval: float = setting(
        0.5,
        p.parse_interval,
        _GATEWAY,
        "seconds between engine GetLoads polls, 0 for none",
        "SECONDS",
        doc="how often each healthy engine's `GetLoads` is polled for the router; `0` turns polling off",
    )
    routing_config: str | None = setting(
        None,
        p.parse_routing_config,
        _GATEWAY,
        "router settings, a JSON object, e.g. '{\"spill_abs\": 4}' (docs/routing.md)",
        "JSON",
        doc="the router's knobs as a JSON object (a `[routing_config]` table in the file, or per model in "
        "`[[models]]`): spill gate, `request_cost_tokens`, `shed_queue_depth` (429 for requests of "
        "negative priority when every engine's queue is that deep), `objectives` and `default_priority` "
        "(request priorities by the `x-gateway-inference-objective` header), `max_fallbacks`, scorer "
        "weights...; keys in [routing.md](routing.md#settings-routerconfig-json-keys), unknown keys "
        "refused at startup",
        default_doc="none (router defaults)",
        model_key="routing_config",
        model_doc="as above, a TOML table",
    )
    destination_fallbacks: int = setting(
        0,
        p.parse_fallbacks,
        _ALL,
        "fallback engines listed after the primary for Envoy's override_host policy; 0 for an ORIGINAL_DST "
        "engines cluster",
        "N",
        doc="fallback engines extproc lists after the primary in `x-gateway-destination-endpoint` "
        "(`ip:port,ip:port`); only for an Envoy whose engines cluster uses the override_host policy — an "
        "ORIGINAL_DST cluster takes one address. `up` sets it itself (see [The Envoy "
        "configuration](#the-envoy-configuration))",
    )
    first_token_timeout: float = setting(
        60.0,
        p.parse_timeout,
        _GATEWAY,
        "seconds an engine may take to send a request's first token before the request ends with 504 "
        "and the engine is penalised; 0 for no limit",
        "SECONDS",
        doc="how long an engine may take to send a streamed request's first token; past it the client gets "
        "504 (type `timeout`), the engine call is aborted and the engine avoided for a while (see "
        "[reliability.md](reliability.md#engine-deadlines)); `0`: no limit",
    )
    inter_token_timeout: float = setting(
        30.0,
        p.parse_timeout,
        _GATEWAY,
        "seconds an engine may go silent between two tokens of a streamed request before it is cut with "
        "an error event; 0 for no limit",
        "SECONDS",
        doc="how long a streamed request's engine may go silent between tokens; past it the stream ends "
        "with an SSE error event and `data: [DONE]` (504 if nothing was sent yet). A non-streamed request "
        "gets `first_token_timeout + inter_token_timeout * max_tokens` for its whole answer; `0`: no limit",
    )
    # Several served models (config file `[[models]]` tables); empty means the single model above.
    models: tuple[ModelConfig, ...] = setting(
        (),
        None,
        _GATEWAY,
        "several served models: [[models]] tables in the config file",
        doc="several served models: `[[models]]` tables in the config file only, see [Several "
        "models](#several-models)",
    )
    api_keys_file: Path | None = setting(  # noqa: RUF009
        None,
        p.parse_api_keys_file,
        _GATEWAY,
        "file of API keys (JSON lines from `extproc keys hash`); unset: no key required",
        "FILE",
        doc="API keys required of every request (`Authorization: Bearer <key>`): one JSON line per key "
        "with its SHA-256 (never the key), a name, the models it may use and a requests-per-minute "
        "limit, as `extproc keys hash` prints it; re-read when it changes (polled every 0.5 s, or on "
        "SIGHUP). See [Headers and authentication](reliability.md#headers-and-authentication)",
        default_doc="none: no key required",
    )
    log_level: str = setting(
        "info",
        p.choice(p.LOG_LEVELS),
        _GATEWAY,
        "extproc log level: " + ", ".join(p.LOG_LEVELS),
        "LEVEL",
        doc="extproc's log level: " + ", ".join(p.LOG_LEVELS),
    )
    log_format: str = setting(
        "text",
        p.choice(("text", "json")),
        _GATEWAY,
        "extproc log format: text (key=value) or json (one JSON object a line)",
        "FORMAT",
        doc="extproc's log format: `text` (readable key=value lines) or `json` (one JSON object a line, "
        "for log collectors); see [health-and-tracing.md](health-and-tracing.md)",
    )
    request_log: bool = setting(
        True,
        p.parse_bool,
        _GATEWAY,
        "log one line per finished request (request id, model, engine, status, timings, tokens)",
        "BOOL",
        doc="one log line per finished request: request id, model, engine, status, per-phase timings and "
        "tokens; never the prompt or completion text; see [health-and-tracing.md](health-and-tracing.md)",
    )
    tracing: bool = setting(
        False,
        p.parse_bool,
        _GATEWAY,
        "OpenTelemetry spans per request (also on when OTEL_EXPORTER_OTLP_ENDPOINT is set)",
        "BOOL",
        doc="an OpenTelemetry span tree per request (request, parse, tokenize, route, engine call with "
        "prefill and decode), exported over OTLP as the standard `OTEL_*` variables say; also on when "
        "`OTEL_EXPORTER_OTLP_ENDPOINT` is set; a client's `traceparent` joins its trace and the engine call "
        "carries one; see [health-and-tracing.md](health-and-tracing.md)",
    )
    metrics_host: str = setting(
        "127.0.0.1",
        p.parse_host,
        _GATEWAY,
        "address of the metrics HTTP server (/metrics, /engines)",
        "IP",
        doc="the IP extproc serves `/metrics` (Prometheus) and `/engines` on; see "
        "[observability](observability.md)",
    )
    metrics_port: int = setting(
        9464,
        p.parse_port_or_off,
        _GATEWAY,
        "port of the metrics HTTP server; 0: off",
        "PORT",
        doc="port of extproc's metrics HTTP server (`/metrics`, `/engines`); 0 turns it off",
    )
    host: str = setting(
        "127.0.0.1",
        p.parse_host,
        _ENVOY,
        "address Envoy listens on for clients",
        "IP",
        doc="the IP Envoy listens on for clients (`0.0.0.0` or `::` for all interfaces)",
    )
    port: int = setting(8080, p.parse_port, _ENVOY, "client HTTP port", "PORT")
    admin_port: int = setting(
        9901,
        p.parse_port,
        _ENVOY,
        "Envoy admin port, loopback only",
        "PORT",
        doc="Envoy admin, always bound to 127.0.0.1",
    )
    sim: int = setting(
        2,
        p.parse_count,
        (UP,),
        "simulated engines to start when no --engine is given",
        "N",
        doc="simulated engines when no engine is configured",
        model_key="sim",
        model_doc="`extproc up`: simulated engines for this model when it has no engines",
    )
    sim_port: int = setting(
        50100,
        p.parse_port,
        (UP,),
        "first simulated engine's port; engine i uses sim-port+i",
        "PORT",
    )
    sim_script: str | None = setting(
        None,
        p.parse_file,
        (UP,),
        "JSON file of scripted outputs for the simulated engines (tool calls, reasoning, fixed answers)",
        "FILE",
        doc="scripted outputs for the simulated engines: a JSON list of rules, e.g. "
        '`[{"match": "weather", "text": "<tool_call>...</tool_call>"}]`; a request whose prompt matches a '
        "rule gets that text's tokens (see the simulator's `--script`)",
    )
    envoy_log_level: str = setting(
        "warning",
        p.choice(p.ENVOY_LOG_LEVELS),
        (UP,),
        "Envoy log level: " + ", ".join(p.ENVOY_LOG_LEVELS),
        "LEVEL",
        doc=", ".join(p.ENVOY_LOG_LEVELS),
    )
    startup_timeout: float = setting(
        60.0,
        p.parse_seconds,
        (UP,),
        "seconds to wait for each child to be ready",
        "SECONDS",
        doc="how long each child may take to become ready",
    )
    response_path: str = setting(
        "auto",
        p.choice(("auto", "module", "ext_proc")),
        _ALL,
        "where engine responses become OpenAI answers: auto, module (inside Envoy) or ext_proc",
        "PATH",
        doc="where the engine's response is turned into the client's answer: `module` (the `extproc_envoy` "
        "dynamic module inside Envoy, built by `make envoy-module`; extproc sees only the response's "
        "headers and trailers) or `ext_proc` (extproc, every engine message crosses Envoy's ext_proc "
        "stream); `auto`: `up` and `envoy-config` take the module when it is built and the Envoy binary "
        "loads it (its dynamic-module ABI), else ext_proc, and say why. `serve` follows the Envoy in "
        "front, per request (`module` forces it). Both answer the same bytes (see "
        "[architecture.md](architecture.md#the-response-path-inside-envoy))",
    )
    module_stop_file: str | None = setting(
        None,
        p.parse_file,
        _ALL,
        "file extproc creates when its shutdown grace ran out, to end the response module's answers",
        "FILE",
        doc="on the module response path, the file extproc creates when its shutdown grace ran out; Envoy's "
        "module, looking for it every 50 ms, then ends the answers it is translating as extproc ends its own "
        "(an SSE error event and `data: [DONE]`, or a 503). `up` sets one in its run directory; where Envoy "
        "and extproc run apart, give both the same path on a shared volume (without it, answers still open "
        "when extproc stops are reset)",
        default_doc="none (`up`: one in its run directory)",
    )
    stream_flush_ms: int = setting(
        0,
        p.parse_flush_ms,
        _ENVOY,
        "module path: milliseconds a stream's tokens after its first may be held to go out together (0: off)",
        "MS",
        doc="on the module response path, how long a stream's bytes after its first content may be held "
        "so that several engine messages reach the client in one write: each write costs Envoy about what "
        "a whole token costs the rest of the path. The first content always goes at once (time to first "
        "token is unchanged); later tokens arrive up to this much later, in batches. `0`: every engine "
        "message's bytes go out at once. The ext_proc path does not hold (see "
        "[benchmarks.md](benchmarks.md#long-streams))",
    )
    envoy_access_log: bool = setting(
        False,
        p.parse_bool,
        _ENVOY,
        "Envoy logs each request to stdout",
        "BOOL",
        doc="Envoy writes one access-log line per request to its stdout",
    )
    request_headers_timeout: float = setting(
        10.0,
        p.parse_timeout,
        _ENVOY,
        "seconds a client has to send its request headers; 0 for no limit",
        "SECONDS",
        doc="a client must send its whole request head within this, or its connection is closed "
        "(slowloris); `0` for no limit. See [reliability.md](reliability.md#at-the-edge-timeouts-limits-"
        "retries-tls)",
    )
    request_timeout: float = setting(
        60.0,
        p.parse_timeout,
        _ENVOY,
        "seconds a client has to send its whole request (the upload); 408 after; 0 for no limit",
        "SECONDS",
        doc="a client must send its whole request, body included, within this, or gets a 408; the "
        "streamed response is not bounded by it; `0` for no limit",
    )
    stream_idle_timeout: float = setting(
        600.0,
        p.parse_timeout,
        _ENVOY,
        "seconds a request may pass with no bytes either way before Envoy ends it; 0 for no limit",
        "SECONDS",
        doc="a request with no bytes either way for this long is ended by Envoy (408 before the response "
        "started, else the stream is cut): a backstop for an engine that stalls; keep it above the "
        "longest wait for a first token you accept and your longest batched completion (answered at its "
        "end); `0` for no limit",
    )
    client_idle_timeout: float = setting(
        300.0,
        p.parse_timeout,
        _ENVOY,
        "seconds a client connection with no open request stays open; 0 for no limit",
        "SECONDS",
        doc="a client connection with no request open is closed after this; `0` for no limit",
    )
    max_client_connections: int | None = setting(
        None,
        p.parse_connections,
        _ENVOY,
        "client connections Envoy keeps open at most; more are closed as accepted",
        "N",
        doc="client connections Envoy keeps open at most (each HTTP/2 connection carries up to 128 "
        "requests); more are closed as soon as accepted. Must leave a tenth of the open-file limit "
        "(`ulimit -n`, at least 256) to Envoy's other connections",
        default_doc="50,000, or less where the open-file limit needs it",
    )
    tls_cert: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM certificate chain for TLS to clients (with --tls-key)",
        "FILE",
        doc="serve clients over TLS (HTTP/2 or HTTP/1.1 by ALPN) with this PEM certificate chain; needs "
        "`tls_key`",
        default_doc="none (plain HTTP)",
    )
    tls_key: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM private key of --tls-cert",
        "FILE",
        doc="the private key of `tls_cert` (PEM)",
    )
    tls_client_ca: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM CA bundle: clients must present a certificate it signed (mutual TLS)",
        "FILE",
        doc="require client certificates signed by this PEM CA bundle (mutual TLS); needs `tls_cert`",
    )
    extproc_tls_ca: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM CA bundle: Envoy reaches extproc over TLS and verifies it against this",
        "FILE",
        doc="Envoy reaches extproc over TLS (HTTP/2 by ALPN) and verifies its certificate against this "
        "CA bundle: for extproc serving TLS itself (`listen_tls_cert`) or behind a TLS-terminating proxy "
        "(see [Securing the ports](#securing-the-ports)). `up` needs it with `listen_tls_cert`, and its "
        "liveness probe uses it (and `extproc_tls_cert`) too",
    )
    extproc_tls_cert: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM client certificate Envoy presents to extproc (mutual TLS; with --extproc-tls-key)",
        "FILE",
        doc="with `extproc_tls_key`: the client certificate Envoy presents to extproc (mutual TLS)",
    )
    extproc_tls_key: str | None = setting(
        None,
        p.parse_file,
        _ENVOY,
        "PEM private key of --extproc-tls-cert",
        "FILE",
        doc="the private key of `extproc_tls_cert`",
    )
    listen_tls_cert: str | None = setting(
        None,
        p.parse_file,
        _GATEWAY,
        "PEM certificate chain: extproc serves its ext_proc port over TLS (with --listen-tls-key)",
        "FILE",
        doc="extproc serves its ext_proc port (`listen`) over TLS with this PEM certificate chain; needs "
        "`listen_tls_key`; Envoy then needs `extproc_tls_ca` (`up` sets Envoy up from the same settings)",
        default_doc="none (plaintext)",
    )
    listen_tls_key: str | None = setting(
        None,
        p.parse_file,
        _GATEWAY,
        "PEM private key of --listen-tls-cert",
        "FILE",
        doc="the private key of `listen_tls_cert`",
    )
    listen_tls_client_ca: str | None = setting(
        None,
        p.parse_file,
        _GATEWAY,
        "PEM CA bundle: ext_proc clients must present a certificate it signed (mutual TLS)",
        "FILE",
        doc="with `listen_tls_cert`: only clients presenting a certificate this PEM CA bundle signed get a "
        "connection (mutual TLS; Envoy presents `extproc_tls_cert`)",
    )
    engine_tls_ca: str | None = setting(
        None,
        p.parse_file,
        _ALL,
        "PEM CA bundle: engines are reached over TLS and verified against this",
        "FILE",
        doc="every engine is reached over TLS (gRPC, HTTP/2 by ALPN) and its certificate verified against "
        "this PEM CA bundle: by Envoy (the engines cluster) and by extproc itself (health checks, model "
        "info, loads, KV events, Abort, batched completions)",
        default_doc="none (plaintext)",
    )
    engine_tls_cert: str | None = setting(
        None,
        p.parse_file,
        _ALL,
        "PEM client certificate presented to engines (mutual TLS; with --engine-tls-key)",
        "FILE",
        doc="with `engine_tls_key`: the client certificate Envoy and extproc present to engines (mutual "
        "TLS); needs `engine_tls_ca`",
    )
    engine_tls_key: str | None = setting(
        None,
        p.parse_file,
        _ALL,
        "PEM private key of --engine-tls-cert",
        "FILE",
        doc="the private key of `engine_tls_cert`",
    )
    engine_tls_server_name: str | None = setting(
        None,
        p.parse_dns_name,
        _ALL,
        "name sent as SNI to engines and required in their certificates",
        "NAME",
        doc="the name sent to engines as SNI and required in their certificates (a DNS name); without "
        "it, extproc checks the engine's address (an IP SAN) and Envoy any name the CA signed",
        default_doc="the engine's address",
    )
    responses_store: str | None = setting(
        None,
        p.parse_responses_store,
        _GATEWAY,
        "where the Responses API stores responses and conversations: memory, none, sqlite:PATH, postgres://...",
        "STORE",
        doc="where `/v1/responses` and `/v1/conversations` keep what they store: `memory` (lost on restart), "
        "`none` (nothing stored: `previous_response_id` and conversations refused), `sqlite:PATH` (survives "
        "restarts) or a `postgres://` URL (shared by several replicas). Unset, `up` keeps them in SQLite in "
        "`state_dir`; `serve`, the building block a deployment assembles, keeps them in memory: where "
        "durable state lives is the operator's choice there. See [responses.md](responses.md)",
        default_doc="`up`: `sqlite:<state_dir>/responses.db`; `serve`: `memory`",
    )
    responses_mcp_max_rounds: int = setting(
        8,
        p.parse_count,
        _GATEWAY,
        "rounds of MCP tool calls one Responses request may run before it ends incomplete",
        "N",
        doc="a Responses request with MCP tools runs the model's calls to them and calls the engine again, "
        "round after round; past this many rounds it ends `incomplete` (reason `max_tool_calls`) instead. "
        "See [responses.md](responses.md#mcp-tools)",
    )
    state_dir: str | None = setting(
        None,
        p.parse_dir,
        (UP,),
        "where `up` keeps state that must survive restarts (the Responses API's SQLite store)",
        "DIR",
        doc="where `up` keeps what must outlive a restart: the Responses API's `responses.db` (unless "
        "`responses_store` says otherwise), created when missing. Per user, as the XDG base directories "
        "put state (not under the cache, whose files `up` may regenerate and a user may delete)",
        default_doc="`$XDG_STATE_HOME/extproc`, else `~/.local/state/extproc`",
    )
    shutdown_grace: float = setting(
        20.0,
        p.parse_grace,
        _GATEWAY,
        "seconds open requests get to finish after SIGTERM before they are cut and their engine requests "
        "aborted",
        "SECONDS",
        doc="on SIGTERM (or Ctrl-C) extproc stops taking requests and gives the open ones this long to "
        "finish; the rest are then cut and their engine requests aborted. `up` drains Envoy first; see "
        "[Lifecycle](#lifecycle)",
    )
    liveness_interval: float = setting(
        5.0,
        p.parse_interval,
        (UP,),
        "seconds between liveness probes of extproc (a gRPC call that must be answered within the "
        "interval); 3 unanswered in a row restart it; 0 for none",
        "SECONDS",
        doc="`up` calls extproc's gRPC port this often; a probe unanswered within the interval fails, and "
        "3 failures in a row get extproc killed and restarted (a hung one is noticed within 4 intervals); "
        "`0` turns probing off. See [Lifecycle](#lifecycle)",
    )


SETTINGS: tuple[Setting, ...] = tuple(replace(f.metadata[_META], name=f.name) for f in fields(Settings))
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The settings a `[[models]]` table may hold, by key, in ModelConfig's order.
_BY_MODEL_KEY = {s.model_key: s for s in SETTINGS if s.model_key is not None}
assert set(_BY_MODEL_KEY) == {f.name for f in fields(ModelConfig)}, "ModelConfig's fields are the model keys"
MODEL_SETTINGS: dict[str, Setting] = {f.name: _BY_MODEL_KEY[f.name] for f in fields(ModelConfig)}
assert all(s.parse is not None or s.file_only for s in SETTINGS), "settings with a flag need a parser"


def command_settings(command: str) -> tuple[Setting, ...]:
    """The settings `command` takes as flags (and from the environment)."""
    return tuple(s for s in SETTINGS if command in s.commands and not s.file_only)


# --- the tables in docs/operating.md ------------------------------------------------------------------------


def _code(text: str) -> str:
    return f"`{text}`"


def _flag_cell(s: Setting) -> str:
    if s.flag is None:
        return "—"
    if s.switch:
        return _code(f"{s.flag} [{s.metavar}]")
    if s.repeatable:
        return _code(f"{s.flag} {s.metavar}") + " (repeatable, or comma list)"
    return _code(f"{s.flag} {s.metavar}")


def _default_cell(s: Setting) -> str:
    if s.default_doc is not None:
        return s.default_doc
    text = s.default_text()
    return "none" if text is None else _code(text)


def settings_table() -> str:
    """Markdown: one row per setting."""
    rows = [
        "| Setting (file key) | Flag | Environment | Default | Used by | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        env = _code(s.env) if s.env else "—"
        used_by = ", ".join(c for c in COMMANDS if c in s.commands)
        cells = [_code(s.name), _flag_cell(s), env, _default_cell(s), used_by, s.doc or s.help]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def models_table() -> str:
    """Markdown: one row per `[[models]]` key."""
    rows = ["| Key | Default | Meaning |", "|---|---|---|"]
    for key, s in MODEL_SETTINGS.items():
        default = _default_cell(s) if s.single_model else f"the global {_code(s.name)}"
        rows.append(f"| {_code(key)} | {default} | {s.model_doc or 'as above'} |")
    return "\n".join(rows)


_TABLES: dict[str, Callable[[], str]] = {"settings": settings_table, "models": models_table}


def _markers(table: str) -> tuple[str, str]:
    return (
        f"<!-- generated {table} table: `make docs` (python -m extproc.settings) from extproc/settings.py; "
        "edit there -->",
        f"<!-- end of generated {table} table -->",
    )


def render_docs(text: str) -> str:
    """`text` (docs/operating.md) with every generated table replaced by the current one."""
    for table, render in _TABLES.items():
        begin, end = _markers(table)
        head, found, rest = text.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not found or not found_end:
            raise ValueError(f"no generated {table} table ({begin} ... {end})")
        text = f"{head}{begin}\n\n{render()}\n\n{end}{tail}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m extproc.settings", description="The settings tables of docs/operating.md."
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--markdown", action="store_true", help="print the tables")
    action.add_argument("--write", metavar="FILE", help="replace the generated tables in FILE")
    args = parser.parse_args(argv)
    if args.markdown:
        print(settings_table() + "\n\n" + models_table())
        return 0
    path = Path(args.write)
    path.write_text(render_docs(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
