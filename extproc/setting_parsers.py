"""Parsers of setting values: a raw value (a string from a flag or the environment, a TOML value from a
config file) in, a typed value out, or `BadValue` carrying the "expected ..." half of a one-line error.

extproc.settings names one parser per setting; extproc.config adds where the value came from, e.g.
    invalid --port 'abc': expected an integer 1-65535
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc import contracts
from extproc.discovery import targets

MiB = 1024 * 1024

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ENVOY_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")
# The router's registry (native/core/src/routing/policy/registry.rs) is the one list of policies.
ROUTING_POLICIES = contracts.ROUTING_POLICIES
DEFAULT_ROUTING_POLICY = contracts.DEFAULT_ROUTING_POLICY
ENGINE_PROTOCOLS = ("auto", "vllm", "sglang")
# Where an engine's KV events come from: SubscribeKvEvents on its gRPC address, nowhere, or (per engine
# only) vLLM's ZMQ publisher, `zmq://host:port[?replay=PORT&topic=T]`.
KV_EVENT_SOURCES = ("grpc", "off")
ZMQ_SCHEMES = ("zmq://", "tcp://", "ipc://")

_SIZE = re.compile(r"(\d+)\s*(|k|kb|kib|m|mb|mib|g|gb|gib)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB}


class BadValue(ValueError):
    """Raised by parsers with the 'expected ...' part of the message."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine of a model: its URL, the protocol it speaks ("auto": detected at registration) and where
    its KV events come from ("grpc", "off" or a ZMQ URL; None: the model's setting, else the global one)."""

    url: str
    protocol: str = "auto"
    kv_events: str | None = None


def _int(raw: Any, lo: int, hi: int | None, expected: str) -> int:
    if isinstance(raw, bool):
        raise BadValue(expected)
    if isinstance(raw, str):
        if not re.fullmatch(r"\s*\+?\d+\s*", raw):
            raise BadValue(expected)
        raw = int(raw)
    if not isinstance(raw, int) or raw < lo or (hi is not None and raw > hi):
        raise BadValue(expected)
    return raw


def parse_port(raw: Any) -> int:
    return _int(raw, 1, 65535, "expected an integer 1-65535")


def parse_port_or_off(raw: Any) -> int:
    """A port, or 0 for a listener that is off."""
    return _int(raw, 0, 65535, "expected an integer 0-65535 (0: off)")


def parse_flush_ms(raw: Any) -> int:
    """Milliseconds a stream's bytes may be held (0: none); a second at most, past it a stream stutters."""
    return _int(raw, 0, 1000, "expected milliseconds 0-1000 (0: off)")


def parse_count(raw: Any) -> int:
    return _int(raw, 0, 1024, "expected an integer 0-1024")


def parse_token_count(raw: Any) -> int:
    return _int(raw, 1, 1 << 40, "expected a positive number of tokens")


def parse_fallbacks(raw: Any) -> int:
    return _int(raw, 0, 16, "expected an integer 0-16")


def parse_routing_config(raw: Any) -> str:
    """A JSON object (a TOML table in a config file); its keys are checked by the router at startup."""
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise BadValue("expected a JSON object of router settings (docs/routing.md)") from None
    if not isinstance(value, dict):
        raise BadValue("expected a JSON object of router settings (docs/routing.md)")
    return json.dumps(value, sort_keys=True)


def parse_size(raw: Any) -> int:
    expected = "expected a positive size in bytes, e.g. 8388608 or 8MiB"
    if isinstance(raw, str):
        m = _SIZE.fullmatch(raw.strip())
        if not m:
            raise BadValue(expected)
        raw = int(m.group(1)) * _SIZE_UNITS[m.group(2)[:1].lower()]
    return _int(raw, 1, None, expected)


def _float(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def parse_seconds(raw: Any) -> float:
    value = _float(raw)
    if value is None or not value > 0:
        raise BadValue("expected a positive number of seconds")
    return value


def parse_interval(raw: Any) -> float:
    value = _float(raw)
    if value is None or not 0 <= value <= 3600:
        raise BadValue("expected seconds between 0 (off) and 3600, e.g. 0.5")
    return value


def parse_grace(raw: Any) -> float:
    value = _float(raw)
    if value is None or not 0 <= value <= 3600:
        raise BadValue("expected seconds between 0 (no grace) and 3600")
    return value


def parse_timeout(raw: Any) -> float:
    value = _float(raw)
    if value is None or not 0 <= value <= 86400:
        raise BadValue("expected seconds between 0 (off) and 86400, e.g. 10")
    return value


def parse_connections(raw: Any) -> int:
    return _int(raw, 1, 10_000_000, "expected a positive number of connections")


def parse_file(raw: Any) -> str:
    """A file path, made absolute here (it need not exist yet: Envoy, which reads it, reports that)."""
    if not isinstance(raw, (str, os.PathLike)) or not str(raw).strip():
        raise BadValue("expected a file path")
    return str(Path(raw).expanduser().resolve())


def parse_dir(raw: Any) -> str:
    """A directory path, made absolute here (created by whoever writes there, when it is first needed)."""
    if not isinstance(raw, (str, os.PathLike)) or not str(raw).strip():
        raise BadValue("expected a directory path")
    return str(Path(raw).expanduser().resolve())


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise BadValue("expected true or false")


# A model's tool-call or reasoning parser: a format name (the native core knows the formats and refuses an
# unknown one at startup), "none", or "auto" (inferred from the model's name and chat template).
_PARSER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def parse_parser_name(raw: Any) -> str:
    """A parser format name, "none" or "auto" (lowercased)."""
    value = raw.strip().lower() if isinstance(raw, str) else ""
    if not _PARSER_NAME.fullmatch(value):
        raise BadValue('expected a parser name (docs/agents.md), "none" or "auto"')
    return value


def choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    """One of `options`, case-insensitive ("warn" reads as "warning")."""

    def parse(raw: Any) -> str:
        value = raw.strip().lower() if isinstance(raw, str) else None
        if value == "warn":
            value = "warning"
        if value not in options:
            raise BadValue("expected one of " + ", ".join(options))
        return value

    return parse


def parse_name(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise BadValue("expected a non-empty name")
    return raw.strip()


_DNS_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def parse_dns_name(raw: Any) -> str:
    """A DNS name (a TLS server name), lower-cased."""
    name = parse_name(raw)
    if not _DNS_NAME.fullmatch(name):
        raise BadValue("expected a DNS name (letters, digits, hyphens and dots)")
    return name.lower()


def parse_host_port(raw: Any) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host without brackets, port)."""
    expected = "expected host:port"
    if not isinstance(raw, str):
        raise BadValue(expected)
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadValue(expected + " with a port 1-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    # IPv6 literals need brackets: "::1:50051" is ambiguous.
    if not host or any(c.isspace() or c in "/[]" for c in host) or (":" in host and not bracketed):
        raise BadValue(expected)
    return host, int(port)


def parse_responses_store(raw: Any) -> str:
    """Where the Responses API stores: `memory`, `none`, `sqlite:PATH` or a PostgreSQL URL."""
    expected = "expected memory, none, sqlite:PATH or postgres://..."
    if not isinstance(raw, str):
        raise BadValue(expected)
    spec = raw.strip()
    if spec in ("memory", "none") or (spec.startswith("sqlite:") and len(spec) > len("sqlite:")):
        return spec
    if spec.startswith(("postgres://", "postgresql://")):
        return spec
    raise BadValue(expected)


def parse_listen(raw: Any) -> str:
    if isinstance(raw, str) and raw.startswith("unix:"):
        path = raw.removeprefix("unix:")
        if not path.lstrip("/") or not path.startswith("/"):
            raise BadValue("expected unix:/absolute/path.sock")
        return raw
    try:
        parse_host_port(raw)
    except BadValue:
        raise BadValue("expected host:port or unix:/path") from None
    return raw.strip()


def parse_engine(raw: Any) -> str:
    """An engine source in its one written form: `grpc://IP:port` (one engine), `grpc://dns-name:port`
    (every address of the name) or `k8s://[namespace/]service[:port]` (the Service's endpoints)."""
    if not isinstance(raw, str):
        raise BadValue(targets.EXPECTED)
    try:
        return targets.target_url(targets.parse_target(raw))
    except ValueError as e:
        raise BadValue(str(e)) from None


def parse_xds_listen(raw: Any) -> str:
    """host:port of extproc's EDS server (no Unix socket: Envoy's gRPC xDS client dials TCP here)."""
    try:
        host, port = parse_host_port(raw)
    except BadValue:
        raise BadValue("expected host:port") from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_http_url(raw: Any) -> str:
    """An http:// or https:// base URL (the Kubernetes API server), without a trailing slash."""
    expected = "expected http(s)://host[:port], e.g. https://10.96.0.1:443 or http://127.0.0.1:8001"
    value = raw.strip().rstrip("/") if isinstance(raw, str) else ""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
        raise BadValue(expected)
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise BadValue(expected) from None
    return value


def parse_engines(raw: Any) -> tuple[str, ...]:
    items: Iterable[Any]
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)):
        # A flag may be repeated and each value may itself be a comma list.
        items = [part for item in raw for part in (item.split(",") if isinstance(item, str) else [item])]
    else:
        raise BadValue("expected a list of grpc://host:port")
    engines = tuple(parse_engine(item) for item in items if not (isinstance(item, str) and not item.strip()))
    if len(set(engines)) != len(engines):
        raise BadValue("expected distinct engines")
    return engines


def parse_host(raw: Any) -> str:
    value = raw.strip() if isinstance(raw, str) else ""
    if value == "localhost":
        return value
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise BadValue("expected an IP address to listen on (e.g. 127.0.0.1 or 0.0.0.0)") from None


def parse_api_keys_file(raw: Any) -> Path:
    """An existing keys file whose every line is a valid key entry (extproc.api_keys)."""
    from extproc.api_keys import KeysFileError, parse_keys

    if not isinstance(raw, (str, os.PathLike)) or not str(raw).strip():
        raise BadValue("expected the path of an API keys file")
    path = Path(raw).expanduser().resolve()
    try:
        parse_keys(path.read_text(), "keys file")
    except OSError as e:
        raise BadValue(f"cannot read it ({e.strerror or e})") from None
    except KeysFileError as e:
        raise BadValue(str(e)) from None
    return path


def parse_model_dir(raw: Any) -> Path:
    if not isinstance(raw, (str, os.PathLike)) or not str(raw).strip():
        raise BadValue("expected a model directory")
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise BadValue("no such directory")
    if not (path / "tokenizer.json").is_file():
        raise BadValue("the directory has no tokenizer.json")
    return path


# --- KV-event sources ---------------------------------------------------------------------------------------

_ZMQ_EXPECTED = "expected grpc, off or zmq://host:port[?replay=PORT&topic=TOPIC] (or tcp://, ipc://)"


def is_zmq_source(kv_events: str | None) -> bool:
    return kv_events is not None and kv_events.lower().startswith(ZMQ_SCHEMES)


def zmq_publisher(kv_events: str) -> str:
    """The publisher address of a ZMQ source (what two engines must not share)."""
    from extproc.kv_events_zmq import ZmqEndpoint

    return ZmqEndpoint.parse(kv_events).events


def _zmq_endpoint_ok(endpoint: str) -> bool:
    """A connectable tcp://host:port or ipc://path (what ZmqEndpoint.parse leaves)."""
    if endpoint.startswith("ipc://"):
        return len(endpoint) > len("ipc://")
    if not endpoint.startswith("tcp://"):
        return False
    try:
        parse_host_port(endpoint.removeprefix("tcp://"))
    except BadValue:
        return False
    return True


def parse_engine_kv_events(raw: Any) -> str:
    """An engine's KV-event source: "grpc", "off" or vLLM's ZMQ publisher (kept as given, parsed again by
    the pool)."""
    if not isinstance(raw, str):
        raise BadValue(_ZMQ_EXPECTED)
    value = raw.strip()
    if value.lower() in KV_EVENT_SOURCES:
        return value.lower()
    if not value.lower().startswith(ZMQ_SCHEMES):
        raise BadValue(_ZMQ_EXPECTED)
    # Imported only for a ZMQ source: it brings pyzmq, which nothing else at config time needs.
    from extproc.kv_events_zmq import ZmqEndpoint

    try:
        endpoint = ZmqEndpoint.parse(value)
    except ValueError:
        raise BadValue(_ZMQ_EXPECTED) from None
    if not all(_zmq_endpoint_ok(e) for e in (endpoint.events, endpoint.replay) if e is not None):
        raise BadValue(_ZMQ_EXPECTED)
    return value


def parse_kv_events(raw: Any) -> str:
    """The global (or a model's) source: a ZMQ URL names one engine's publisher, so only grpc or off."""
    value = raw.strip().lower() if isinstance(raw, str) else None
    if value is not None and value.startswith(ZMQ_SCHEMES):
        raise BadValue(
            "expected grpc or off: a ZMQ publisher is one engine's, set it in that engine's [[models]] "
            'table, { url = "grpc://...", kv_events = "zmq://..." }'
        )
    if value not in KV_EVENT_SOURCES:
        raise BadValue("expected one of " + ", ".join(KV_EVENT_SOURCES))
    return value


def parse_model_engines(raw: Any) -> tuple[EngineConfig, ...]:
    """A model's engines: URLs, or tables `{ url = "grpc://...", protocol = "sglang", kv_events = "..." }`."""
    if not isinstance(raw, list):
        raise BadValue('expected a list of "grpc://host:port" or { url = ..., protocol = ... } tables')
    engines: list[EngineConfig] = []
    for item in raw:
        if isinstance(item, dict):
            unknown = set(item) - {"url", "protocol", "kv_events"}
            if unknown or "url" not in item:
                raise BadValue("expected engine tables with url and optionally protocol and kv_events")
            protocol = choice(ENGINE_PROTOCOLS)(item.get("protocol", "auto"))
            source = item.get("kv_events")
            try:
                kv_events = None if source is None else parse_engine_kv_events(source)
            except BadValue as exc:
                raise BadValue(f"kv_events {source!r}: {exc}") from None
            url = parse_engine(item["url"])
            if kv_events is not None and is_zmq_source(kv_events) and not targets.is_static(url):
                raise BadValue(f"kv_events {source!r}: a ZMQ publisher is one engine's; {url} may be many")
            engines.append(EngineConfig(url, protocol, kv_events))
        else:
            engines.append(EngineConfig(parse_engine(item)))
    if len({e.url for e in engines}) != len(engines):
        raise BadValue("expected distinct engines")
    return tuple(engines)
