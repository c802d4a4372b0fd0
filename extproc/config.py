"""Settings for every extproc command: defaults < config file (TOML) < environment (EXTPROC_*) < flags.

Every layer hands in raw values (TOML types, environment strings, flag strings); one parser per field turns
them into typed values, so a bad value gets the same one-line error wherever it came from, naming its source:
    invalid --port 'abc': expected an integer 1-65535
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

MiB = 1024 * 1024

CONFIG_ENV = "EXTPROC_CONFIG"
ENV_PREFIX = "EXTPROC_"


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


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "listen": _parse_listen,
    "model_dir": _parse_model_dir,
    "model_name": _parse_name,
    "engines": _parse_engines,
    "max_body_bytes": _parse_size,
    "routing_policy": _choice(ROUTING_POLICIES),
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
        if key == "model_dir" and isinstance(raw, str):
            # Relative paths in a file are relative to the file, not to wherever extproc was started.
            raw = str(file.parent / Path(raw).expanduser())
        values[key] = _parse(key, raw, f"{key} in {file}")
    return values


def read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    return {f: _parse(f, env[env_name(f)], env_name(f)) for f in FIELDS if env_name(f) in env}


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
    return replace(settings, **read_flags(flags or {}))


def settings_to_flags(settings: Settings, only: Iterable[str]) -> list[str]:
    """Command-line flags that reproduce the given fields (for child processes)."""
    argv: list[str] = []
    for field in only:
        value = getattr(settings, field)
        if value is None:
            continue
        if field == "engines":
            for engine in value:
                argv += [flag_name(field), engine]
        elif isinstance(value, bool):
            argv += [flag_name(field), "true" if value else "false"]
        else:
            argv += [flag_name(field), str(value)]
    return argv
