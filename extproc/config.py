"""Settings for every extproc command: defaults < config file (TOML) < environment (EXTPROC_*) < flags.

Every layer hands in raw values (TOML types, environment strings, flag strings); one parser per field turns
them into typed values, so a bad value gets the same one-line error wherever it came from, naming its source:
    invalid --port 'abc': expected an integer 1-65535

One model is configured with model_dir/model_name/engines; several with `[[models]]` tables in the file
(`ModelConfig`), which only a file can hold. `served_models()` resolves either form into the models to
serve, global settings filled in.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from extproc import models as model_files

MiB = 1024 * 1024

CONFIG_ENV = "EXTPROC_CONFIG"
ENV_PREFIX = "EXTPROC_"


ENGINE_PROTOCOLS = ("auto", "vllm", "sglang")
# Where an engine's KV events come from: SubscribeKvEvents on its gRPC address, nowhere, or (per engine
# only) vLLM's ZMQ publisher, `zmq://host:port[?replay=PORT&topic=T]`.
KV_EVENT_SOURCES = ("grpc", "off")
ZMQ_SCHEMES = ("zmq://", "tcp://", "ipc://")


@dataclass(frozen=True)
class EngineConfig:
    """One engine of a model: its URL, the protocol it speaks ("auto": detected at registration) and where
    its KV events come from ("grpc", "off" or a ZMQ URL; None: the model's setting, else the global one)."""

    url: str
    protocol: str = "auto"
    kv_events: str | None = None


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` table of the config file; None means "the global setting"."""

    name: str | None = None
    model_dir: Path | None = None
    engines: tuple[EngineConfig, ...] = ()
    routing_policy: str | None = None
    routing_config: str | None = None
    engine_protocol: str | None = None
    sim: int | None = None
    # "grpc" or "off" for the engines that do not name their own source.
    kv_events: str | None = None

    def served_name(self) -> str:
        """The name clients ask for, without touching the disk."""
        if self.name:
            return self.name
        return self.model_dir.name if self.model_dir is not None else model_files.DEFAULT_MODEL_NAME


@dataclass(frozen=True)
class Settings:
    # The ext_proc gRPC server: "host:port" or "unix:/path/to.sock".
    listen: str = "127.0.0.1:50051"
    # Hugging Face style model directory; None means the default model (extproc.models).
    model_dir: Path | None = None
    # Served model name; None means the model directory's name.
    model_name: str | None = None
    # Engine endpoints, each "grpc://host:port". Empty with `up` means: start simulated engines.
    engines: tuple[str, ...] = ()
    # Largest client request body accepted, in bytes (413 above it).
    max_body_bytes: int = 8 * MiB
    # How an engine is picked per request (docs/routing.md).
    routing_policy: str = "kv_events"
    # The router's settings (docs/routing.md, "Settings"), a JSON object; None keeps every default.
    routing_config: str | None = None
    # The engines' gRPC protocol, unless an engine or model says otherwise: "auto" probes each engine.
    engine_protocol: str = "auto"
    # Where engines' KV events come from unless an engine says otherwise: "grpc" or "off".
    kv_events: str = "grpc"
    # Seconds between GetLoads polls of each healthy engine; 0 turns polling off.
    load_interval: float = 0.5
    # Fallback engines extproc lists after the primary in the destination (the endpoint-picker protocol).
    # 0 for an Envoy whose engines cluster is ORIGINAL_DST (one address); `up` sets it when its Envoy
    # knows the engines (override_host), as do deployments with such an Envoy.
    destination_fallbacks: int = 0
    # Several served models (config file `[[models]]` tables); empty means the single model above.
    models: tuple[ModelConfig, ...] = ()
    log_level: str = "info"
    # The local stack (`extproc up`).
    host: str = "127.0.0.1"
    port: int = 8080
    admin_port: int = 9901
    sim: int = 2
    sim_port: int = 50100
    envoy_log_level: str = "warning"
    # Seconds `up` waits for each child (simulator, extproc, Envoy) to become ready.
    startup_timeout: float = 60.0
    # Envoy writes an access log line per request to its stdout.
    envoy_access_log: bool = False


def engine_address(url: str) -> str:
    """`grpc://host:port` → `host:port` (what Envoy's destination header carries)."""
    prefix = "grpc://"
    if not url.startswith(prefix) or ":" not in url[len(prefix) :]:
        raise ValueError(f"engine URL must look like grpc://host:port, got {url!r}")
    return url[len(prefix) :]


class ConfigError(ValueError):
    """A bad setting; str() is one line naming the source, e.g. "invalid --port 'abc': ..."."""


# --- per-field parsers: raw value (str from env/flags, TOML type from files) -> typed value ----------------

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ROUTING_POLICIES = (
    "kv_events",
    "prefix_cache",
    "weighted",
    "round_robin",
    "random",
    "least_load",
    "power_of_two",
    "consistent_hash",
)
_ENVOY_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
_SIZE = re.compile(r"(\d+)\s*(|k|kb|kib|m|mb|mib|g|gb|gib)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB}


class _Bad(ValueError):
    """Raised by parsers with the 'expected ...' part of the message."""


def _int(raw: Any, lo: int, hi: int | None, expected: str) -> int:
    if isinstance(raw, bool):
        raise _Bad(expected)
    if isinstance(raw, str):
        if not re.fullmatch(r"\s*\+?\d+\s*", raw):
            raise _Bad(expected)
        raw = int(raw)
    if not isinstance(raw, int) or raw < lo or (hi is not None and raw > hi):
        raise _Bad(expected)
    return raw


def parse_port(raw: Any) -> int:
    return _int(raw, 1, 65535, "expected an integer 1-65535")


def _parse_count(raw: Any) -> int:
    return _int(raw, 0, 1024, "expected an integer 0-1024")


def _parse_fallbacks(raw: Any) -> int:
    return _int(raw, 0, 16, "expected an integer 0-16")


def _parse_routing_config(raw: Any) -> str:
    """A JSON object (a TOML table in a config file); its keys are checked by the router at startup."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise _Bad("expected a JSON object of router settings (docs/routing.md)") from None
    if not isinstance(value, dict):
        raise _Bad("expected a JSON object of router settings (docs/routing.md)")
    return json.dumps(value, sort_keys=True)


def _parse_size(raw: Any) -> int:
    expected = "expected a positive size in bytes, e.g. 8388608 or 8MiB"
    if isinstance(raw, str):
        m = _SIZE.fullmatch(raw.strip())
        if not m:
            raise _Bad(expected)
        raw = int(m.group(1)) * _SIZE_UNITS[m.group(2)[:1].lower()]
    return _int(raw, 1, None, expected)


def _parse_seconds(raw: Any) -> float:
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else -1.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise _Bad("expected a positive number of seconds")
    return value


def _parse_interval(raw: Any) -> float:
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else -1.0
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise _Bad("expected seconds between 0 (off) and 3600, e.g. 0.5")
    return value


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise _Bad("expected true or false")


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = raw.strip().lower() if isinstance(raw, str) else None
        if value == "warn":
            value = "warning"
        if value not in options:
            raise _Bad("expected one of " + ", ".join(options))
        return value

    return parse


def _parse_name(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _Bad("expected a non-empty name")
    return raw.strip()


def parse_host_port(raw: Any) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host without brackets, port)."""
    expected = "expected host:port"
    if not isinstance(raw, str):
        raise _Bad(expected)
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _Bad(expected + " with a port 1-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    # IPv6 literals need brackets: "::1:50051" is ambiguous.
    if not host or any(c.isspace() or c in "/[]" for c in host) or (":" in host and not bracketed):
        raise _Bad(expected)
    return host, int(port)


def _parse_listen(raw: Any) -> str:
    if isinstance(raw, str) and raw.startswith("unix:"):
        path = raw.removeprefix("unix:")
        if not path.lstrip("/") or not path.startswith("/"):
            raise _Bad("expected unix:/absolute/path.sock")
        return raw
    try:
        parse_host_port(raw)
    except _Bad:
        raise _Bad("expected host:port or unix:/path") from None
    return raw.strip()


def _parse_engine(raw: Any) -> str:
    expected = "expected grpc://host:port"
    if not isinstance(raw, str) or not raw.strip().startswith("grpc://"):
        raise _Bad(expected)
    try:
        host, port = parse_host_port(raw.strip().removeprefix("grpc://").rstrip("/"))
    except _Bad:
        raise _Bad(expected) from None
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # Envoy's ORIGINAL_DST cluster takes the engine from the destination header as IP:port only.
        raise _Bad("expected an IP address, not a name: Envoy routes to engines by IP:port") from None
    return f"grpc://[{ip}]:{port}" if ip.version == 6 else f"grpc://{ip}:{port}"


def _parse_engines(raw: Any) -> tuple[str, ...]:
    items: Iterable[Any]
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        # A flag may be repeated and each value may itself be a comma list.
        items = [part for item in raw for part in (item.split(",") if isinstance(item, str) else [item])]
    else:
        raise _Bad("expected a list of grpc://host:port")
    engines = tuple(_parse_engine(item) for item in items if not (isinstance(item, str) and not item.strip()))
    if len(set(engines)) != len(engines):
        raise _Bad("expected distinct engines")
    return engines


def _parse_host(raw: Any) -> str:
    value = raw.strip() if isinstance(raw, str) else ""
    if value == "localhost":
        return value
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise _Bad("expected an IP address to listen on (e.g. 127.0.0.1 or 0.0.0.0)") from None


def _parse_model_dir(raw: Any) -> Path:
    if not isinstance(raw, (str, os.PathLike)) or not str(raw).strip():
        raise _Bad("expected a model directory")
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise _Bad("no such directory")
    if not (path / "tokenizer.json").is_file():
        raise _Bad("the directory has no tokenizer.json")
    return path


_ZMQ_EXPECTED = "expected grpc, off or zmq://host:port[?replay=PORT&topic=TOPIC] (or tcp://, ipc://)"


def _zmq_endpoint_ok(endpoint: str) -> bool:
    """A connectable tcp://host:port or ipc://path (what ZmqEndpoint.parse leaves)."""
    if endpoint.startswith("ipc://"):
        return len(endpoint) > len("ipc://")
    if not endpoint.startswith("tcp://"):
        return False
    try:
        parse_host_port(endpoint.removeprefix("tcp://"))
    except _Bad:
        return False
    return True


def _parse_engine_kv_events(raw: Any) -> str:
    """An engine's KV-event source: "grpc", "off" or vLLM's ZMQ publisher (kept as given, parsed again by
    the pool)."""
    if not isinstance(raw, str):
        raise _Bad(_ZMQ_EXPECTED)
    value = raw.strip()
    if value.lower() in KV_EVENT_SOURCES:
        return value.lower()
    if not value.lower().startswith(ZMQ_SCHEMES):
        raise _Bad(_ZMQ_EXPECTED)
    # Imported only for a ZMQ source: it brings pyzmq, which nothing else at config time needs.
    from extproc.kv_events_zmq import ZmqEndpoint

    try:
        endpoint = ZmqEndpoint.parse(value)
    except ValueError:
        raise _Bad(_ZMQ_EXPECTED) from None
    if not all(_zmq_endpoint_ok(e) for e in (endpoint.events, endpoint.replay) if e is not None):
        raise _Bad(_ZMQ_EXPECTED)
    return value


def _parse_kv_events(raw: Any) -> str:
    """The global (or a model's) source: a ZMQ URL names one engine's publisher, so only grpc or off."""
    value = raw.strip().lower() if isinstance(raw, str) else None
    if value is not None and value.startswith(ZMQ_SCHEMES):
        raise _Bad(
            "expected grpc or off: a ZMQ publisher is one engine's, set it in that engine's [[models]] "
            'table, { url = "grpc://...", kv_events = "zmq://..." }'
        )
    if value not in KV_EVENT_SOURCES:
        raise _Bad("expected one of " + ", ".join(KV_EVENT_SOURCES))
    return value


def _parse_model_engines(raw: Any) -> tuple[EngineConfig, ...]:
    """A model's engines: URLs, or tables `{ url = "grpc://...", protocol = "sglang", kv_events = "..." }`."""
    if not isinstance(raw, list):
        raise _Bad('expected a list of "grpc://host:port" or { url = ..., protocol = ... } tables')
    engines: list[EngineConfig] = []
    for item in raw:
        if isinstance(item, dict):
            unknown = set(item) - {"url", "protocol", "kv_events"}
            if unknown or "url" not in item:
                raise _Bad("expected engine tables with url and optionally protocol and kv_events")
            protocol = _choice(ENGINE_PROTOCOLS)(item.get("protocol", "auto"))
            source = item.get("kv_events")
            try:
                kv_events = None if source is None else _parse_engine_kv_events(source)
            except _Bad as exc:
                raise _Bad(f"kv_events {source!r}: {exc}") from None
            engines.append(EngineConfig(_parse_engine(item["url"]), protocol, kv_events))
        else:
            engines.append(EngineConfig(_parse_engine(item)))
    if len({e.url for e in engines}) != len(engines):
        raise _Bad("expected distinct engines")
    return tuple(engines)


_MODEL_PARSERS: dict[str, Callable[[Any], Any]] = {
    "name": _parse_name,
    "model_dir": _parse_model_dir,
    "engines": _parse_model_engines,
    "routing_policy": _choice(ROUTING_POLICIES),
    "routing_config": _parse_routing_config,
    "engine_protocol": _choice(ENGINE_PROTOCOLS),
    "sim": _parse_count,
    "kv_events": _parse_kv_events,
}


def _show_value(raw: Any) -> str:
    if isinstance(raw, list):
        return ",".join(item.get("url", "?") if isinstance(item, dict) else str(item) for item in raw)
    return str(raw)


def _parse_models(raw: Any, base: Path | None = None, origin: str = "") -> tuple[ModelConfig, ...]:
    """`[[models]]` tables; a relative model_dir is relative to `base` (the config file's folder).

    `origin` (" in FILE") names where they came from in errors."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"invalid models{origin}: expected [[models]] tables")
    parsed: list[ModelConfig] = []
    for i, table in enumerate(raw):
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in _MODEL_PARSERS:
                known = ", ".join(_MODEL_PARSERS)
                raise ConfigError(f"invalid models[{i}]{origin}: unknown key {key!r} (known: {known})")
            if key == "model_dir" and isinstance(value, str) and base is not None:
                value = str(base / Path(value).expanduser())
            try:
                values[key] = _MODEL_PARSERS[key](value)
            except _Bad as exc:
                raise ConfigError(
                    f"invalid models[{i}].{key}{origin} {_show_value(value)!r}: {exc}"
                ) from None
        parsed.append(ModelConfig(**values))
    _check_models(parsed, origin)
    return tuple(parsed)


def is_zmq_source(kv_events: str | None) -> bool:
    return kv_events is not None and kv_events.lower().startswith(ZMQ_SCHEMES)


def _zmq_publisher(kv_events: str) -> str:
    from extproc.kv_events_zmq import ZmqEndpoint

    return ZmqEndpoint.parse(kv_events).events


def _check_models(models: list[ModelConfig], origin: str) -> None:
    """Names are distinct (they key the routing table), no engine serves two models and no ZMQ publisher
    feeds two engines (each would be credited with the other's cache)."""
    names: dict[str, int] = {}
    owners: dict[str, str] = {}
    publishers: dict[str, str] = {}
    for i, model in enumerate(models):
        name = model.served_name()
        if name in names:
            raise ConfigError(
                f"invalid models{origin}: models[{names[name]}] and models[{i}] are both named {name!r}"
            )
        names[name] = i
        for engine in model.engines:
            if engine.url in owners:
                first = owners[engine.url]
                message = f"engine {engine.url} is given to both {first!r} and {name!r}"
                raise ConfigError(f"invalid models{origin}: {message}")
            owners[engine.url] = name
            if engine.kv_events is not None and is_zmq_source(engine.kv_events):
                publisher = _zmq_publisher(engine.kv_events)
                if publisher in publishers:
                    first = publishers[publisher]
                    message = f"engines {first} and {engine.url} both take KV events from {publisher}"
                    raise ConfigError(f"invalid models{origin}: {message}")
                publishers[publisher] = engine.url


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "listen": _parse_listen,
    "model_dir": _parse_model_dir,
    "model_name": _parse_name,
    "engines": _parse_engines,
    "max_body_bytes": _parse_size,
    "routing_policy": _choice(ROUTING_POLICIES),
    "routing_config": _parse_routing_config,
    "engine_protocol": _choice(ENGINE_PROTOCOLS),
    "kv_events": _parse_kv_events,
    "load_interval": _parse_interval,
    "destination_fallbacks": _parse_fallbacks,
    "models": _parse_models,
    "log_level": _choice(_LOG_LEVELS),
    "host": _parse_host,
    "port": parse_port,
    "admin_port": parse_port,
    "sim": _parse_count,
    "sim_port": parse_port,
    "envoy_log_level": _choice(_ENVOY_LOG_LEVELS),
    "startup_timeout": _parse_seconds,
    "envoy_access_log": _parse_bool,
}
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Settings))
assert set(FIELDS) == set(_PARSERS), "every Settings field needs a parser"
# Tables have no environment or flag form: several models are configured in a file.
FILE_ONLY = frozenset({"models"})
# The single-model settings that `[[models]]` replaces.
SINGLE_MODEL_FIELDS = ("model_dir", "model_name", "engines")


def flag_name(field: str) -> str:
    return "--" + ("engine" if field == "engines" else field.replace("_", "-"))


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _show(raw: Any) -> str:
    text = ",".join(map(str, raw)) if isinstance(raw, (list, tuple)) else str(raw)
    return repr(text)


def _parse(field: str, raw: Any, source: str) -> Any:
    try:
        return _PARSERS[field](raw)
    except _Bad as exc:
        raise ConfigError(f"invalid {source} {_show(raw)}: {exc}") from None


# --- layers -------------------------------------------------------------------------------------------------


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Typed values from a TOML file whose top-level keys are Settings field names."""
    file = Path(path).expanduser()
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in _PARSERS:
            raise ConfigError(f"config file {file}: unknown key {key!r} (known: {', '.join(FIELDS)})")
        if key == "models":
            values[key] = _parse_models(raw, file.parent, f" in {file}")
            continue
        if key == "model_dir" and isinstance(raw, str):
            # Relative paths in a file are relative to the file, not to wherever extproc was started.
            raw = str(file.parent / Path(raw).expanduser())
        values[key] = _parse(key, raw, f"{key} in {file}")
    return values


def read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    given = [f for f in FIELDS if f not in FILE_ONLY and env_name(f) in env]
    return {f: _parse(f, env[env_name(f)], env_name(f)) for f in given}


def read_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values keyed by field name; None means the flag was not given."""
    values: dict[str, Any] = {}
    for key, raw in flags.items():
        if key not in _PARSERS:
            raise KeyError(f"not a Settings field: {key}")
        if raw is not None:
            values[key] = _parse(key, raw, flag_name(key))
    return values


def load_settings(
    flags: Mapping[str, Any] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults < config file (`config_file`, else $EXTPROC_CONFIG) < EXTPROC_* < flags."""
    env = os.environ if env is None else env
    settings = Settings()
    config_file = config_file or env.get(CONFIG_ENV) or None
    if config_file:
        settings = replace(settings, **read_config_file(config_file))
    settings = replace(settings, **read_environment(env))
    settings = replace(settings, **read_flags(flags or {}))
    if settings.models:
        mixed = [f for f in SINGLE_MODEL_FIELDS if getattr(settings, f) not in (None, ())]
        if mixed:
            given = ", ".join(f"{f} ({flag_name(f)}/{env_name(f)})" for f in mixed)
            raise ConfigError(f"[[models]] in the config file replaces {given}: configure one or the other")
    _check_zmq_protocols(settings)
    return settings


def _engine_protocol(engine: EngineConfig, table: ModelConfig, settings: Settings) -> str:
    """An engine's own protocol, else its model's, else the global one."""
    if engine.protocol != "auto":
        return engine.protocol
    return table.engine_protocol or settings.engine_protocol


def _check_zmq_protocols(settings: Settings) -> None:
    """ZMQ sources are vLLM's publisher: refused for an engine configured as SGLang (one detected as SGLang
    falls back to gRPC in the pool, with a warning)."""
    for table in settings.models:
        for engine in table.engines:
            if is_zmq_source(engine.kv_events) and _engine_protocol(engine, table, settings) == "sglang":
                where = f"engine {engine.url} of model {table.served_name()!r}"
                raise ConfigError(
                    f"{where}: kv_events {engine.kv_events!r} is vLLM's ZMQ publisher but the engine speaks "
                    'sglang: use kv_events = "grpc"'
                )


# --- what is served -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModel:
    """A model as the gateway serves it: every setting resolved (global ones filled in)."""

    name: str
    model_dir: Path
    engines: tuple[EngineConfig, ...]
    routing_policy: str
    # The router's settings as a JSON object (None: defaults).
    routing_config: str | None
    # The model's protocol setting ("auto" unless configured); each engine may still name its own.
    engine_protocol: str
    # Simulated engines `up` starts for it when it has no engines.
    sim: int
    # The model's KV-event source ("grpc" or "off") for engines without their own; each engine's is
    # resolved in `engines`.
    kv_events: str = "grpc"

    @property
    def sim_protocol(self) -> str:
        """The protocol its simulated engines speak."""
        return "vllm" if self.engine_protocol == "auto" else self.engine_protocol


def served_models(settings: Settings) -> tuple[ServedModel, ...]:
    """The models to serve: the `[[models]]` tables, or the single model of model_dir/model_name/engines.

    Materializes the default model folder when a model has no model_dir.
    """
    tables = settings.models or (
        ModelConfig(
            name=settings.model_name,
            model_dir=settings.model_dir,
            engines=tuple(EngineConfig(url) for url in settings.engines),
        ),
    )
    _check_zmq_protocols(settings)
    served: list[ServedModel] = []
    for table in tables:
        model_dir = model_files.resolve_model_dir(table.model_dir)
        protocol = table.engine_protocol or settings.engine_protocol
        kv_events = table.kv_events or settings.kv_events
        engines = tuple(
            EngineConfig(e.url, protocol if e.protocol == "auto" else e.protocol, e.kv_events or kv_events)
            for e in table.engines
        )
        served.append(
            ServedModel(
                name=model_files.served_model_name(model_dir, table.name),
                model_dir=model_dir,
                engines=engines,
                routing_policy=table.routing_policy or settings.routing_policy,
                routing_config=table.routing_config or settings.routing_config,
                engine_protocol=protocol,
                sim=settings.sim if table.sim is None else table.sim,
                kv_events=kv_events,
            )
        )
    return tuple(served)


def _toml_string(text: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes).
    return json.dumps(text)


def models_toml(models: Iterable[ServedModel]) -> str:
    """`[[models]]` tables that reproduce resolved models (for a child process's config file)."""
    lines: list[str] = []
    for model in models:
        engines = ", ".join(
            f"{{ url = {_toml_string(e.url)}, protocol = {_toml_string(e.protocol)}, "
            f"kv_events = {_toml_string(e.kv_events or model.kv_events)} }}"
            for e in model.engines
        )
        lines += [
            "[[models]]",
            f"name = {_toml_string(model.name)}",
            f"model_dir = {_toml_string(str(model.model_dir))}",
            f"engines = [{engines}]",
            f"routing_policy = {_toml_string(model.routing_policy)}",
            *([f"routing_config = {_toml_string(model.routing_config)}"] if model.routing_config else []),
            f"engine_protocol = {_toml_string(model.engine_protocol)}",
            f"kv_events = {_toml_string(model.kv_events)}",
            "",
        ]
    return "\n".join(lines)


def settings_to_flags(settings: Settings, only: Iterable[str]) -> list[str]:
    """Command-line flags that reproduce the given fields (for child processes)."""
    argv: list[str] = []
    for field in only:
        value = getattr(settings, field)
        if value is None or field in FILE_ONLY:
            continue
        if field == "engines":
            for engine in value:
                argv += [flag_name(field), engine]
        elif isinstance(value, bool):
            argv += [flag_name(field), "true" if value else "false"]
        else:
            argv += [flag_name(field), str(value)]
    return argv
