"""Settings for every extproc command: defaults < config file (TOML) < environment (EXTPROC_*) < flags.

Which settings there are, and each one's parser, flag and variable, is declared in extproc.settings; this
module layers them. Every layer hands in raw values (TOML types, environment strings, flag strings); the
setting's parser turns them into typed values, so a bad value gets the same one-line error wherever it came
from, naming its source:
    invalid --port 'abc': expected an integer 1-65535

One model is configured with model_dir/model_name/engines; several with `[[models]]` tables in the file
(`ModelConfig`), which only a file can hold. `served_models()` resolves either form into the models to
serve, global settings filled in.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from extproc import models as model_files
from extproc.discovery.targets import StaticTarget, parse_target
from extproc.setting_parsers import BadValue, EngineConfig, is_zmq_source, zmq_publisher
from extproc.settings import (
    CONFIG_ENV,
    MODEL_SETTINGS,
    SETTINGS,
    SETTINGS_BY_NAME,
    ModelConfig,
    Settings,
)


def engine_address(url: str) -> str:
    """`grpc://IP:port` → `IP:port` (what Envoy's destination header carries); ValueError for an engine
    found by discovery (a DNS name, a Kubernetes Service), which has no one address."""
    target = parse_target(url)
    if not isinstance(target, StaticTarget):
        raise ValueError(f"engine {url!r} is discovered at run time: it has no fixed address")
    return target.address


class ConfigError(ValueError):
    """A bad setting; str() is one line naming the source, e.g. "invalid --port 'abc': ..."."""


# --- [[models]] tables -------------------------------------------------------------------------------------


def _model_parser(key: str) -> Callable[[Any], Any]:
    setting = MODEL_SETTINGS[key]
    parse = setting.model_parse or setting.parse
    assert parse is not None, f"models key {key} has no parser"
    return parse


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
            if key not in MODEL_SETTINGS:
                known = ", ".join(MODEL_SETTINGS)
                raise ConfigError(f"invalid models[{i}]{origin}: unknown key {key!r} (known: {known})")
            if key == "model_dir" and isinstance(value, str) and base is not None:
                value = str(base / Path(value).expanduser())
            try:
                values[key] = _model_parser(key)(value)
            except BadValue as exc:
                raise ConfigError(
                    f"invalid models[{i}].{key}{origin} {_show_value(value)!r}: {exc}"
                ) from None
        parsed.append(ModelConfig(**values))
    _check_models(parsed, origin)
    return tuple(parsed)


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
                publisher = zmq_publisher(engine.kv_events)
                if publisher in publishers:
                    first = publishers[publisher]
                    message = f"engines {first} and {engine.url} both take KV events from {publisher}"
                    raise ConfigError(f"invalid models{origin}: {message}")
                publishers[publisher] = engine.url


# --- one value ----------------------------------------------------------------------------------------------


def _show(raw: Any) -> str:
    text = ",".join(map(str, raw)) if isinstance(raw, (list, tuple)) else str(raw)
    return repr(text)


def _parse(field: str, raw: Any, source: str) -> Any:
    parse = SETTINGS_BY_NAME[field].parse
    assert parse is not None, f"{field} has no parser"
    try:
        return parse(raw)
    except BadValue as exc:
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
        if key not in SETTINGS_BY_NAME:
            known = ", ".join(SETTINGS_BY_NAME)
            raise ConfigError(f"config file {file}: unknown key {key!r} (known: {known})")
        if key == "models":
            values[key] = _parse_models(raw, file.parent, f" in {file}")
            continue
        if key == "model_dir" and isinstance(raw, str):
            # Relative paths in a file are relative to the file, not to wherever extproc was started.
            raw = str(file.parent / Path(raw).expanduser())
        values[key] = _parse(key, raw, f"{key} in {file}")
    return values


def read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    return {s.name: _parse(s.name, env[s.env], s.env) for s in SETTINGS if s.env is not None and s.env in env}


def read_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values keyed by field name; None means the flag was not given."""
    values: dict[str, Any] = {}
    for key, raw in flags.items():
        setting = SETTINGS_BY_NAME.get(key)
        if setting is None:
            raise KeyError(f"not a Settings field: {key}")
        if raw is not None:
            if setting.flag is None:
                raise KeyError(f"{key} has no flag form")
            values[key] = _parse(key, raw, setting.flag)
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
        mixed = [s for s in SETTINGS if s.single_model and getattr(settings, s.name) not in (None, ())]
        if mixed:
            given = ", ".join(f"{s.name} ({s.flag}/{s.env})" for s in mixed)
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
    # Its chat answers' tool-call and reasoning parsers: a format name, "none" or "auto".
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"

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
                tool_parser=table.tool_parser or settings.tool_parser,
                reasoning_parser=table.reasoning_parser or settings.reasoning_parser,
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
            f"tool_parser = {_toml_string(model.tool_parser)}",
            f"reasoning_parser = {_toml_string(model.reasoning_parser)}",
            "",
        ]
    return "\n".join(lines)


def settings_to_flags(settings: Settings, only: Iterable[str]) -> list[str]:
    """Command-line flags that reproduce the given fields (for child processes)."""
    argv: list[str] = []
    for field in only:
        setting = SETTINGS_BY_NAME[field]
        value = getattr(settings, field)
        if value is None or setting.flag is None:
            continue
        if setting.repeatable:
            for item in value:
                argv += [setting.flag, str(item)]
        elif setting.switch:
            argv += [setting.flag, "true" if value else "false"]
        else:
            argv += [setting.flag, str(value)]
    return argv
