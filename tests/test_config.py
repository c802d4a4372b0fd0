"""Settings: layering (defaults < file < environment < flags) and one-line validation errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from extproc.config import (
    ConfigError,
    EngineConfig,
    ModelConfig,
    ServedModel,
    Settings,
    load_settings,
    models_toml,
    served_models,
    settings_to_flags,
)
from extproc.setting_parsers import MiB


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "my-model"
    path.mkdir()
    (path / "tokenizer.json").write_text("{}")
    return path


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "extproc.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_layer() -> None:
    assert load_settings(env={}) == Settings()


def test_layers_override_in_order(tmp_path: Path) -> None:
    config = _toml(tmp_path, 'port = 1000\nadmin_port = 1001\nsim = 5\nlog_level = "debug"\n')
    env = {"EXTPROC_PORT": "2000", "EXTPROC_ADMIN_PORT": "2001"}
    settings = load_settings({"port": "3000", "sim": None}, config_file=config, env=env)
    assert settings.port == 3000  # flag beats env and file
    assert settings.admin_port == 2001  # env beats file
    assert settings.sim == 5  # file beats default; a flag not given (None) changes nothing
    assert settings.log_level == "debug"
    assert settings.sim_port == Settings().sim_port


def test_config_file_from_environment(tmp_path: Path) -> None:
    config = _toml(tmp_path, "port = 1234\n")
    assert load_settings(env={"EXTPROC_CONFIG": str(config)}).port == 1234


def test_explicit_config_file_beats_environment_one(tmp_path: Path) -> None:
    config = _toml(tmp_path, "port = 1234\n")
    other = tmp_path / "other.toml"
    other.write_text("port = 4321\n")
    assert load_settings(config_file=other, env={"EXTPROC_CONFIG": str(config)}).port == 4321


def test_engines_from_every_layer(tmp_path: Path) -> None:
    config = _toml(tmp_path, 'engines = ["grpc://10.0.0.1:1", "grpc://10.0.0.2:2"]\n')
    assert load_settings(config_file=config, env={}).engines == ("grpc://10.0.0.1:1", "grpc://10.0.0.2:2")
    env = {"EXTPROC_ENGINES": "grpc://10.0.0.3:3, grpc://10.0.0.4:4"}
    assert load_settings(env=env).engines == ("grpc://10.0.0.3:3", "grpc://10.0.0.4:4")
    flags = {"engines": ["grpc://localhost:5", "grpc://10.0.0.6:6,grpc://[::1]:7"]}
    expected = ("grpc://127.0.0.1:5", "grpc://10.0.0.6:6", "grpc://[::1]:7")
    assert load_settings(flags, env=env).engines == expected


def test_typed_values(model_dir: Path) -> None:
    settings = load_settings(
        {
            "model_dir": str(model_dir),
            "model_name": "served",
            "max_body_bytes": "16MiB",
            "listen": "unix:/tmp/extproc.sock",
            "host": "0.0.0.0",
            "envoy_log_level": "WARN",
            "envoy_access_log": "true",
            "startup_timeout": "2.5",
        },
        env={},
    )
    assert settings.model_dir == model_dir.resolve()
    assert settings.model_name == "served"
    assert settings.max_body_bytes == 16 * MiB
    assert settings.listen == "unix:/tmp/extproc.sock"
    assert settings.host == "0.0.0.0"
    assert settings.envoy_log_level == "warning"
    assert settings.envoy_access_log is True
    assert settings.startup_timeout == 2.5


def test_model_dir_in_file_is_relative_to_the_file(tmp_path: Path, model_dir: Path) -> None:
    config = _toml(tmp_path, f'model_dir = "{model_dir.name}"\n')
    assert load_settings(config_file=config, env={}).model_dir == model_dir.resolve()


BAD_FLAGS = [
    ("port", "abc", "invalid --port 'abc': expected an integer 1-65535"),
    ("port", "0", "invalid --port '0': expected an integer 1-65535"),
    ("admin_port", "65536", "invalid --admin-port '65536': expected an integer 1-65535"),
    ("sim", "-1", "invalid --sim '-1': expected an integer 0-1024"),
    ("sim_port", "1.5", "invalid --sim-port '1.5': expected an integer 1-65535"),
    ("engines", ["http://a:1"], "invalid --engine 'http://a:1': expected grpc://IP:port, grpc://dns-name"),
    ("engines", ["grpc://a"], "invalid --engine 'grpc://a': expected grpc://IP:port"),
    ("engines", ["grpc://bad_name:1"], "invalid --engine 'grpc://bad_name:1': expected grpc://IP:port"),
    ("engines", ["k8s://Ns/svc"], "invalid --engine 'k8s://Ns/svc': expected grpc://IP:port"),
    ("engines", ["k8s://ns/svc:0"], "invalid --engine 'k8s://ns/svc:0': expected grpc://IP:port"),
    ("engines", ["grpc://1.2.3.4:1"] * 2, "invalid --engine 'grpc://1.2.3.4:1,grpc://1.2.3.4:1': expected"),
    ("listen", "50051", "invalid --listen '50051': expected host:port or unix:/path"),
    ("listen", "unix:relative", "invalid --listen 'unix:relative': expected unix:/absolute/path.sock"),
    ("listen", "::1:50051", "invalid --listen '::1:50051': expected host:port or unix:/path"),
    ("log_level", "loud", "invalid --log-level 'loud': expected one of debug, info"),
    ("host", "example.com", "invalid --host 'example.com': expected an IP address"),
    ("max_body_bytes", "lots", "invalid --max-body-bytes 'lots': expected a positive size"),
    ("max_body_bytes", "0", "invalid --max-body-bytes '0': expected a positive size"),
    ("model_name", " ", "invalid --model-name ' ': expected a non-empty name"),
    ("startup_timeout", "0", "invalid --startup-timeout '0': expected a positive number of seconds"),
    ("envoy_access_log", "maybe", "invalid --envoy-access-log 'maybe': expected true or false"),
]


@pytest.mark.parametrize(("field", "raw", "message"), BAD_FLAGS)
def test_bad_flag_values_get_one_line_errors(field: str, raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({field: raw}, env={})
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_model_dir_must_exist_with_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        load_settings({"model_dir": str(tmp_path / "missing")}, env={})
    with pytest.raises(ConfigError, match=r"invalid --model-dir .*: the directory has no tokenizer.json"):
        load_settings({"model_dir": str(tmp_path)}, env={})


def test_bad_environment_values_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^invalid EXTPROC_PORT 'http': expected an integer 1-65535$"):
        load_settings(env={"EXTPROC_PORT": "http"})
    with pytest.raises(ConfigError, match=r"^invalid EXTPROC_ENGINES 'grpc://1.2.3.4:1,nope'"):
        load_settings(env={"EXTPROC_ENGINES": "grpc://1.2.3.4:1,nope"})


def test_unrelated_environment_is_ignored() -> None:
    assert load_settings(env={"EXTPROC_CACHE_DIR": "/tmp", "EXTPROC_ENVOY_BIN": "/x"}) == Settings()


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'prot'"):
        load_settings(config_file=_toml(tmp_path, "prot = 1\n"), env={})
    with pytest.raises(ConfigError, match=r"invalid port in .*extproc.toml 'x': expected an integer"):
        load_settings(config_file=_toml(tmp_path, 'port = "x"\n'), env={})
    with pytest.raises(ConfigError, match=r"invalid port in .*: expected an integer"):
        load_settings(config_file=_toml(tmp_path, "port = true\n"), env={})
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(config_file=_toml(tmp_path, "port = \n"), env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(config_file=tmp_path / "nope.toml", env={})


def test_settings_round_trip_through_flags(model_dir: Path) -> None:
    settings = Settings(
        listen="127.0.0.1:7000",
        model_dir=model_dir.resolve(),
        model_name="m",
        engines=("grpc://127.0.0.1:1", "grpc://127.0.0.1:2"),
        max_body_bytes=123,
        log_level="debug",
    )
    fields = ("listen", "model_dir", "model_name", "engines", "max_body_bytes", "log_level")
    argv = settings_to_flags(settings, fields)
    flags: dict[str, object] = {}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        field = {"--engine": "engines"}.get(flag, flag[2:].replace("-", "_"))
        if field == "engines":
            flags.setdefault("engines", []).append(value)  # type: ignore[union-attr]
        else:
            flags[field] = value
    assert load_settings(flags, env={}) == settings


# --- engine protocol, GetLoads interval ---------------------------------------------------------------------


def test_engine_protocol_and_load_interval_from_every_layer(tmp_path: Path) -> None:
    assert (Settings().engine_protocol, Settings().load_interval) == ("auto", 0.5)
    config = _toml(tmp_path, 'engine_protocol = "sglang"\nload_interval = 2\n')
    settings = load_settings(config_file=config, env={})
    assert (settings.engine_protocol, settings.load_interval) == ("sglang", 2.0)
    env = {"EXTPROC_ENGINE_PROTOCOL": "VLLM", "EXTPROC_LOAD_INTERVAL": "0.25"}
    settings = load_settings(config_file=config, env=env)
    assert (settings.engine_protocol, settings.load_interval) == ("vllm", 0.25)
    settings = load_settings({"engine_protocol": "auto", "load_interval": "0"}, config_file=config, env=env)
    assert (settings.engine_protocol, settings.load_interval) == ("auto", 0.0)


@pytest.mark.parametrize(
    ("field", "raw", "message"),
    [
        (
            "engine_protocol",
            "trtllm",
            "invalid --engine-protocol 'trtllm': expected one of auto, vllm, sglang",
        ),
        ("load_interval", "-1", "invalid --load-interval '-1': expected seconds between 0 (off) and 3600"),
        (
            "load_interval",
            "soon",
            "invalid --load-interval 'soon': expected seconds between 0 (off) and 3600",
        ),
    ],
)
def test_bad_protocol_and_interval(field: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({field: raw}, env={})
    assert str(err.value).startswith(message)


# --- several models ([[models]] tables) ---------------------------------------------------------------------


TWO_MODELS = """
routing_policy = "least_load"
engine_protocol = "vllm"
sim = 3

[[models]]
name = "chat"
model_dir = "my-model"
engines = ["grpc://10.0.0.1:1", { url = "grpc://10.0.0.2:2", protocol = "sglang" }]
routing_policy = "round_robin"
tool_parser = "Hermes"

[[models]]
engine_protocol = "auto"
sim = 1
"""


def test_models_tables_resolve_with_the_global_settings(tmp_path: Path, model_dir: Path) -> None:
    settings = load_settings(config_file=_toml(tmp_path, TWO_MODELS), env={})
    chat, default = served_models(settings)
    assert chat == ServedModel(
        name="chat",
        model_dir=model_dir.resolve(),  # relative to the file
        # Every engine's KV-event source resolved too: the global default, gRPC.
        engines=(
            EngineConfig("grpc://10.0.0.1:1", "vllm", "grpc"),
            EngineConfig("grpc://10.0.0.2:2", "sglang", "grpc"),
        ),
        routing_policy="round_robin",
        routing_config=None,
        engine_protocol="vllm",
        sim=3,
        # A model's own parser, else the global one ("auto": inferred by the native core).
        tool_parser="hermes",
        reasoning_parser="auto",
    )
    # No name and no directory: the default model under its own name.
    assert (default.name, default.model_dir.name) == ("llama3-default", "llama3-default")
    assert (default.engines, default.routing_policy, default.engine_protocol, default.sim) == (
        (),
        "least_load",
        "auto",
        1,
    )
    assert default.sim_protocol == "vllm" and chat.sim_protocol == "vllm"


def test_the_single_model_form_is_one_served_model(model_dir: Path) -> None:
    flags = {"model_dir": str(model_dir), "engines": ["grpc://10.0.0.1:1"], "engine_protocol": "sglang"}
    (only,) = served_models(load_settings(flags, env={}))
    assert (only.name, only.engines) == ("my-model", (EngineConfig("grpc://10.0.0.1:1", "sglang", "grpc"),))
    assert only.sim_protocol == "sglang"


def test_models_round_trip_through_the_generated_file(tmp_path: Path, model_dir: Path) -> None:
    served = served_models(load_settings(config_file=_toml(tmp_path, TWO_MODELS), env={}))
    written = tmp_path / "generated" / "models.toml"
    written.parent.mkdir()
    written.write_text(models_toml(served))
    again = served_models(load_settings(config_file=written, env={}))
    # Everything but `sim` (the server never simulates) survives.
    assert [replace(m, sim=0) for m in again] == [replace(m, sim=0) for m in served]


BAD_MODELS = [
    ('[[models]]\nname = "a"\n[[models]]\nname = "a"\n', r"models\[0\] and models\[1\] are both named 'a'"),
    (
        '[[models]]\nmodel_dir = "my-model"\n[[models]]\nname = "my-model"\n',
        r"models\[0\] and models\[1\] are both named 'my-model'",
    ),
    ("[[models]]\n[[models]]\n", r"both named 'llama3-default'"),
    (
        '[[models]]\nname = "a"\nengines = ["grpc://10.0.0.1:1"]\n'
        '[[models]]\nname = "b"\nengines = ["grpc://10.0.0.1:1"]\n',
        r"engine grpc://10.0.0.1:1 is given to both 'a' and 'b'",
    ),
    (
        '[[models]]\nname = "a"\ncolour = 1\n',
        r"invalid models\[0\] in .*extproc.toml: unknown key 'colour' \(known: name",
    ),
    (
        '[[models]]\nengines = ["grpc://engine_1.svc:1"]\n',
        r"models\[0\]\.engines in .*extproc.toml 'grpc://engine_1.svc:1': expected grpc://IP:port",
    ),
    (
        '[[models]]\nengines = [{ url = "k8s://ns/vllm", kv_events = "zmq://10.0.0.1:5557" }]\n',
        r"kv_events 'zmq://10.0.0.1:5557': a ZMQ publisher is one engine's; k8s://ns/vllm may be many",
    ),
    (
        '[[models]]\nengines = [{ url = "grpc://10.0.0.1:1", protocol = "tgi" }]\n',
        r"models\[0\]\.engines in .*extproc.toml 'grpc://10.0.0.1:1': expected one of auto, vllm, sglang",
    ),
    ('[[models]]\nengines = [{ address = "grpc://10.0.0.1:1" }]\n', r"expected engine tables with url"),
    (
        '[[models]]\nrouting_policy = "fastest"\n',
        r"models\[0\]\.routing_policy in .*extproc.toml 'fastest': expected one of",
    ),
    (
        '[[models]]\nmodel_dir = "nowhere"\n',
        r"models\[0\]\.model_dir in .*extproc.toml '.*nowhere': no such directory",
    ),
    ('models = "chat"\n', r"invalid models in .*: expected \[\[models\]\] tables"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_MODELS)
def test_bad_models_tables_get_one_line_errors(
    tmp_path: Path, model_dir: Path, text: str, pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern) as err:
        load_settings(config_file=_toml(tmp_path, text), env={})
    assert "\n" not in str(err.value)


def test_models_tables_exclude_the_single_model_settings(tmp_path: Path) -> None:
    config = _toml(tmp_path, '[[models]]\nname = "a"\n')
    with pytest.raises(ConfigError, match=r"^\[\[models\]\] in the config file replaces engines \(--engine/"):
        load_settings({"engines": ["grpc://10.0.0.1:1"]}, config_file=config, env={})
    with pytest.raises(ConfigError, match=r"replaces model_name \(--model-name/EXTPROC_MODEL_NAME\)"):
        load_settings(config_file=config, env={"EXTPROC_MODEL_NAME": "x"})
    # The other settings still layer over the file.
    assert load_settings({"port": "1234"}, config_file=config, env={}).port == 1234


def test_models_have_no_environment_form() -> None:
    assert load_settings(env={"EXTPROC_MODELS": "a,b"}).models == ()


def test_routing_config_from_a_flag_a_table_or_per_model(tmp_path: Path) -> None:
    flags = {"routing_config": '{"request_cost_tokens": 8, "spill_abs": 4}'}
    settings = load_settings(flags, env={})
    assert settings.routing_config == '{"request_cost_tokens": 8, "spill_abs": 4}'
    # A TOML table is the file form; the environment takes JSON.
    table = _toml(tmp_path, "[routing_config]\nspill_ratio = 2.0\n")
    assert load_settings(config_file=table, env={}).routing_config == '{"spill_ratio": 2.0}'
    env = {"EXTPROC_ROUTING_CONFIG": '{"max_fallbacks": 1}'}
    assert load_settings(env=env).routing_config == '{"max_fallbacks": 1}'
    # A model's own table wins over the global one, and survives the file `up` hands to the server.
    models = _toml(
        tmp_path,
        '[routing_config]\nspill_abs = 4\n[[models]]\nname = "a"\nrouting_config = { spill_abs = 2 }\n'
        '[[models]]\nname = "b"\n',
    )
    a, b = served_models(load_settings(config_file=models, env={}))
    assert (a.routing_config, b.routing_config) == ('{"spill_abs": 2}', '{"spill_abs": 4}')
    written = tmp_path / "resolved.toml"
    written.write_text(models_toml((a, b)))
    again = served_models(load_settings(config_file=written, env={}))
    assert [m.routing_config for m in again] == [a.routing_config, b.routing_config]


@pytest.mark.parametrize("raw", ["[1]", "{not json", "3"])
def test_routing_config_must_be_a_json_object(raw: str) -> None:
    with pytest.raises(ConfigError, match="expected a JSON object of router settings"):
        load_settings({"routing_config": raw}, env={})


# --- KV-event sources ---------------------------------------------------------------------------------------

KV_SOURCES = """
kv_events = "off"

[[models]]
name = "a"
engines = [
    "grpc://10.0.0.1:1",
    { url = "grpc://10.0.0.2:2", kv_events = "zmq://10.0.0.2:5557?replay=5567&topic=kv-events" },
    { url = "grpc://10.0.0.3:3", protocol = "vllm", kv_events = "ipc:///run/vllm/kv.ipc" },
]

[[models]]
name = "b"
kv_events = "GRPC"
engines = ["grpc://10.0.1.1:1", { url = "grpc://10.0.1.2:2", kv_events = "off" }]
"""


def test_kv_events_resolve_per_engine_then_model_then_global(tmp_path: Path) -> None:
    assert Settings().kv_events == "grpc"
    a, b = served_models(load_settings(config_file=_toml(tmp_path, KV_SOURCES), env={}))
    assert [e.kv_events for e in a.engines] == [
        "off",  # the global setting
        "zmq://10.0.0.2:5557?replay=5567&topic=kv-events",
        "ipc:///run/vllm/kv.ipc",
    ]
    assert (a.kv_events, b.kv_events) == ("off", "grpc")
    assert [e.kv_events for e in b.engines] == ["grpc", "off"]  # the model's, then the engine's own


def test_kv_events_from_the_environment_and_flags(tmp_path: Path) -> None:
    config = _toml(tmp_path, 'kv_events = "off"\n')
    assert load_settings(config_file=config, env={}).kv_events == "off"
    assert load_settings(config_file=config, env={"EXTPROC_KV_EVENTS": "grpc"}).kv_events == "grpc"
    flags = {"kv_events": "Off", "engines": ["grpc://10.0.0.1:1"]}
    settings = load_settings(flags, env={"EXTPROC_KV_EVENTS": "grpc"})
    (only,) = served_models(settings)
    assert (settings.kv_events, only.engines[0].kv_events) == ("off", "off")


def test_kv_events_round_trip_through_the_generated_file(tmp_path: Path) -> None:
    served = served_models(load_settings(config_file=_toml(tmp_path, KV_SOURCES), env={}))
    written = tmp_path / "generated" / "models.toml"
    written.parent.mkdir()
    written.write_text(models_toml(served))
    # The server reads it without the global setting: each engine's source is written out.
    again = served_models(load_settings(config_file=written, env={}))
    assert [replace(m, sim=0) for m in again] == [replace(m, sim=0) for m in served]
    # Engines `up` adds for a model without any (simulated ones) take the model's source.
    (a, _) = served
    sims = replace(a, engines=(EngineConfig("grpc://127.0.0.1:9"),))
    written.write_text(models_toml([sims]))
    (again_a,) = served_models(load_settings(config_file=written, env={}))
    assert again_a.engines == (EngineConfig("grpc://127.0.0.1:9", "auto", "off"),)


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"kv_events": "zeromq"}, {}, "invalid --kv-events 'zeromq': expected one of grpc, off"),
        (
            {"kv_events": "zmq://10.0.0.1:5557"},
            {},
            "invalid --kv-events 'zmq://10.0.0.1:5557': expected grpc or off: a ZMQ publisher is one",
        ),
        (
            {},
            {"EXTPROC_KV_EVENTS": "tcp://*:5557"},
            "invalid EXTPROC_KV_EVENTS 'tcp://*:5557': expected",
        ),
    ],
)
def test_a_global_kv_events_is_grpc_or_off(flags: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags, env=env)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def _engine_table(kv_events: str, protocol: str = "auto") -> str:
    table = f'{{ url = "grpc://10.0.0.1:1", protocol = "{protocol}", kv_events = "{kv_events}" }}'
    return f"[[models]]\nengines = [{table}]\n"


BAD_KV_EVENTS = [
    (
        _engine_table("nats://10.0.0.1:1"),
        r"engines in .*extproc.toml 'grpc://10.0.0.1:1': kv_events 'nats://",
    ),
    (_engine_table("zmq://10.0.0.1"), r"kv_events 'zmq://10.0.0.1': expected grpc, off or zmq://host:port"),
    (_engine_table("zmq://10.0.0.1:99999"), r"kv_events 'zmq://10.0.0.1:99999': expected grpc, off or zmq"),
    (_engine_table("zmq://10.0.0.1:5557?replay=r"), r"kv_events 'zmq://10.0.0.1:5557\?replay=r': expected"),
    (_engine_table("ipc:///tmp/kv.ipc?replay=5567"), r"kv_events 'ipc:///tmp/kv.ipc\?replay=5567': expected"),
    (_engine_table("ipc://"), r"kv_events 'ipc://': expected grpc, off or zmq"),
    (
        '[[models]]\nkv_events = "zmq://10.0.0.1:5557"\n',
        r"models\[0\]\.kv_events in .*extproc.toml 'zmq://10.0.0.1:5557': expected grpc or off: a ZMQ",
    ),
    (
        '[[models]]\nengines = [{ url = "grpc://10.0.0.1:1", kv_events = "zmq://10.0.0.9:5557" },'
        ' { url = "grpc://10.0.0.2:1", kv_events = "tcp://10.0.0.9:5557?topic=x" }]\n',
        r"engines grpc://10.0.0.1:1 and grpc://10.0.0.2:1 both take KV events from tcp://10.0.0.9:5557",
    ),
    # vLLM's publisher on an engine configured as SGLang: refused (a detected one falls back to gRPC).
    (
        _engine_table("zmq://10.0.0.1:5557", "sglang"),
        r"^engine grpc://10.0.0.1:1 of model 'llama3-default': kv_events 'zmq://10.0.0.1:5557' is vLLM's ZMQ "
        r"publisher but the engine speaks sglang: use kv_events = \"grpc\"$",
    ),
    (
        'engine_protocol = "sglang"\n' + _engine_table("zmq://10.0.0.1:5557"),
        r"engine grpc://10.0.0.1:1 of model 'llama3-default': .* speaks sglang",
    ),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_KV_EVENTS)
def test_bad_kv_event_sources_get_one_line_errors(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as err:
        load_settings(config_file=_toml(tmp_path, text), env={})
    assert "\n" not in str(err.value)


def test_a_model_configured_as_sglang_refuses_zmq_also_when_built_in_code() -> None:
    engine = EngineConfig("grpc://10.0.0.1:1", kv_events="zmq://10.0.0.1:5557")
    settings = Settings(models=(ModelConfig(name="m", engines=(engine,), engine_protocol="sglang"),))
    with pytest.raises(ConfigError, match="speaks sglang"):
        served_models(settings)
    # Detected protocols are the pool's business: "auto" passes.
    (served,) = served_models(replace(settings, models=(ModelConfig(name="m", engines=(engine,)),)))
    assert served.engines[0].kv_events == "zmq://10.0.0.1:5557"


ENGINE_SOURCES = [
    # One engine at a fixed address, as always.
    ("grpc://10.0.0.7:8001", "grpc://10.0.0.7:8001"),
    ("grpc://localhost:8001", "grpc://127.0.0.1:8001"),
    ("grpc://[fd00::7]:8001/", "grpc://[fd00::7]:8001"),
    # Every address of a DNS name, re-resolved.
    ("grpc://VLLM.ns.svc.cluster.local.:8001", "grpc://vllm.ns.svc.cluster.local:8001"),
    # A Kubernetes Service's endpoints: namespace, port name or number optional.
    ("k8s://inference/vllm:grpc", "k8s://inference/vllm:grpc"),
    ("k8s://vllm:8001", "k8s://vllm:8001"),
    ("k8s://vllm/", "k8s://vllm"),
]


@pytest.mark.parametrize(("raw", "written"), ENGINE_SOURCES)
def test_engines_are_addresses_dns_names_or_kubernetes_services(raw: str, written: str) -> None:
    assert load_settings({"engines": [raw]}, env={}).engines == (written,)


def test_the_kubernetes_api_url_is_checked() -> None:
    assert load_settings({"kubernetes_api": "http://127.0.0.1:8001/"}, env={}).kubernetes_api == (
        "http://127.0.0.1:8001"
    )
    with pytest.raises(ConfigError, match=r"invalid --kubernetes-api 'ftp://x': expected http\(s\)://"):
        load_settings({"kubernetes_api": "ftp://x"}, env={})
