"""The settings declarations: every setting reaches its field through its flag (on exactly the commands
declared), its environment variable and its TOML key; defaults read back through their own parsers; the
settings tables in docs/operating.md are the generated ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extproc import cli, settings, stack
from extproc.config import ConfigError, load_settings
from extproc.setting_parsers import BadValue, parse_dir, parse_file, parse_responses_store
from extproc.settings import COMMANDS, SETTINGS, SETTINGS_BY_NAME, Setting

OPERATING_MD = Path(__file__).resolve().parents[1] / "docs" / "operating.md"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "my-model"
    path.mkdir()
    (path / "tokenizer.json").write_text("{}")
    # The api_keys_file sample, beside the model directory.
    (tmp_path / "keys.jsonl").write_text(f'{{"sha256": "{"ab" * 32}", "name": "k", "models": ["*"]}}\n')
    return path


def samples(model_dir: Path) -> dict[str, tuple[str, Any]]:
    """A value other than the default for every setting with a flag: as typed, and as parsed."""
    return {
        "listen": ("127.0.0.1:7000", "127.0.0.1:7000"),
        "engines": ("grpc://10.0.0.1:1,grpc://localhost:2", ("grpc://10.0.0.1:1", "grpc://127.0.0.1:2")),
        "dns_refresh_interval": ("0.5", 0.5),
        "kubernetes_api": ("https://10.96.0.1:443", "https://10.96.0.1:443"),
        "kubernetes_token_file": ("/etc/k8s/token", "/etc/k8s/token"),
        "kubernetes_ca_file": ("/etc/k8s/ca.crt", "/etc/k8s/ca.crt"),
        "xds_listen": ("[::1]:18000", "[::1]:18000"),
        "model_dir": (str(model_dir), model_dir.resolve()),
        "model_name": ("served", "served"),
        "max_body_bytes": ("1MiB", 1024 * 1024),
        "max_buffered_output_tokens": ("65536", 65536),
        "request_workers": ("3", 3),
        "responses_store": ("none", "none"),
        "responses_mcp_max_rounds": ("3", 3),
        "state_dir": ("/var/lib/extproc", "/var/lib/extproc"),
        "routing_policy": ("least_load", "least_load"),
        "engine_protocol": ("SGLANG", "sglang"),
        "kv_events": ("off", "off"),
        "tool_parser": ("Hermes", "hermes"),
        "reasoning_parser": ("none", "none"),
        "load_interval": ("2", 2.0),
        "first_token_timeout": ("1.5", 1.5),
        "inter_token_timeout": ("0", 0.0),
        "routing_config": ('{"spill_abs": 4}', '{"spill_abs": 4}'),
        "response_path": ("module", "module"),
        "destination_fallbacks": ("3", 3),
        "log_level": ("debug", "debug"),
        "log_format": ("JSON", "json"),
        "request_log": ("false", False),
        "tracing": ("true", True),
        "metrics_host": ("0.0.0.0", "0.0.0.0"),
        "metrics_port": ("0", 0),
        "host": ("0.0.0.0", "0.0.0.0"),
        "port": ("8181", 8181),
        "admin_port": ("9191", 9191),
        "sim": ("5", 5),
        "sim_port": ("41000", 41000),
        "sim_script": ("/etc/extproc/script.json", "/etc/extproc/script.json"),
        "envoy_log_level": ("DEBUG", "debug"),
        "startup_timeout": ("2.5", 2.5),
        "envoy_access_log": ("true", True),
        "module_stop_file": ("/run/extproc/module-stop", "/run/extproc/module-stop"),
        "stream_flush_ms": ("20", 20),
        "shutdown_grace": ("0", 0.0),
        "liveness_interval": ("1.5", 1.5),
        "request_headers_timeout": ("0", 0.0),
        "request_timeout": ("120", 120.0),
        "stream_idle_timeout": ("30.5", 30.5),
        "client_idle_timeout": ("0", 0.0),
        "max_client_connections": ("500", 500),
        "tls_cert": ("/etc/tls/gateway.pem", "/etc/tls/gateway.pem"),
        "tls_key": ("/etc/tls/gateway.key", "/etc/tls/gateway.key"),
        "tls_client_ca": ("/etc/tls/clients.pem", "/etc/tls/clients.pem"),
        "extproc_tls_ca": ("/etc/tls/extproc-ca.pem", "/etc/tls/extproc-ca.pem"),
        "extproc_tls_cert": ("/etc/tls/envoy.pem", "/etc/tls/envoy.pem"),
        "extproc_tls_key": ("/etc/tls/envoy.key", "/etc/tls/envoy.key"),
        "listen_tls_cert": ("/etc/tls/extproc.pem", "/etc/tls/extproc.pem"),
        "listen_tls_key": ("/etc/tls/extproc.key", "/etc/tls/extproc.key"),
        "listen_tls_client_ca": ("/etc/tls/envoy-ca.pem", "/etc/tls/envoy-ca.pem"),
        "engine_tls_ca": ("/etc/tls/engine-ca.pem", "/etc/tls/engine-ca.pem"),
        "engine_tls_cert": ("/etc/tls/gateway-client.pem", "/etc/tls/gateway-client.pem"),
        "engine_tls_key": ("/etc/tls/gateway-client.key", "/etc/tls/gateway-client.key"),
        "engine_tls_server_name": ("engines.internal", "engines.internal"),
        "api_keys_file": (str(model_dir.parent / "keys.jsonl"), (model_dir.parent / "keys.jsonl").resolve()),
    }


WITH_FLAGS = [s for s in SETTINGS if not s.file_only]


def test_every_setting_with_a_flag_has_a_sample(model_dir: Path) -> None:
    """A new setting must be added to `samples` (and so to the layer tests below)."""
    assert sorted(samples(model_dir)) == sorted(s.name for s in WITH_FLAGS)


@pytest.mark.parametrize("setting", WITH_FLAGS, ids=lambda s: s.name)
def test_each_layer_reaches_the_setting(setting: Setting, model_dir: Path, tmp_path: Path) -> None:
    raw, expected = samples(model_dir)[setting.name]
    assert expected != setting.default
    assert setting.env is not None
    from_env = load_settings(env={setting.env: raw})
    config = tmp_path / "extproc.toml"
    config.write_text(f"{setting.name} = {json.dumps(raw)}\n")  # a JSON string is a TOML string
    from_file = load_settings(config_file=config, env={})
    assert getattr(from_env, setting.name) == getattr(from_file, setting.name) == expected


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("setting", WITH_FLAGS, ids=lambda s: s.name)
def test_a_command_takes_exactly_the_flags_declared_for_it(
    setting: Setting, command: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, expected = samples(model_dir)[setting.name]
    assert setting.flag is not None
    parser = cli.build_parser()
    if command not in setting.commands:
        with pytest.raises(SystemExit):
            parser.parse_args([command, setting.flag, raw])
        assert f"unrecognized arguments: {setting.flag}" in capsys.readouterr().err
        return
    args = parser.parse_args([command, setting.flag, raw])
    assert getattr(cli._settings(args, command), setting.name) == expected
    assert cli.main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    assert setting.flag in help_text and setting.metavar in help_text and f"[{setting.env}]" in help_text


def test_a_switch_flag_alone_means_true_and_a_list_flag_repeats(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(
        [
            "envoy-config",
            "--envoy-access-log",
            "--engine",
            "grpc://10.0.0.1:1",
            "--engine",
            "grpc://10.0.0.2:2",
        ]
    )
    loaded = cli._settings(args, "envoy-config")
    assert loaded.envoy_access_log is True
    assert loaded.engines == ("grpc://10.0.0.1:1", "grpc://10.0.0.2:2")


WITH_LITERAL_DEFAULTS = [s for s in SETTINGS if s.parse is not None and s.default_doc is None]


@pytest.mark.parametrize("setting", WITH_LITERAL_DEFAULTS, ids=lambda s: s.name)
def test_defaults_read_back_through_their_parser(setting: Setting) -> None:
    """The default shown in --help and the docs is a value the setting accepts, and means the default."""
    assert setting.parse is not None
    text = setting.default_text()
    if text is None:
        assert setting.default in (None, ())
        return
    assert setting.parse(text) == setting.default


def test_models_tables_have_no_flag_or_environment_form() -> None:
    models = SETTINGS_BY_NAME["models"]
    assert (models.flag, models.env) == (None, None)
    assert load_settings(env={"EXTPROC_MODELS": "a"}).models == ()
    with pytest.raises(KeyError):
        load_settings({"models": "a"}, env={})


def test_bad_values_name_the_layer_they_came_from() -> None:
    for setting in WITH_FLAGS:
        if setting.name == "model_name":  # any non-empty name is valid
            continue
        # Any path is: Envoy, which reads the file, says if it is missing; `up` creates a missing folder.
        if setting.parse in (parse_file, parse_dir):
            continue
        with pytest.raises(ConfigError, match=rf"^invalid {setting.flag} '\?\?': \S"):
            load_settings({setting.name: "??"}, env={})
        with pytest.raises(ConfigError, match=rf"^invalid {setting.env} '\?\?': \S"):
            load_settings(env={setting.env or "": "??"})


def test_children_of_up_inherit_no_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in WITH_FLAGS:
        monkeypatch.setenv(setting.env or "", "x")
    monkeypatch.setenv("EXTPROC_CONFIG", "/nowhere.toml")
    monkeypatch.setenv("EXTPROC_CACHE_DIR", "/tmp/cache")
    env = stack.child_env()
    assert not {"EXTPROC_CONFIG", *(s.env for s in WITH_FLAGS)} & set(env)
    assert env["EXTPROC_CACHE_DIR"] == "/tmp/cache"


def test_the_docs_tables_are_the_generated_ones() -> None:
    text = OPERATING_MD.read_text()
    assert settings.render_docs(text) == text, "docs/operating.md is stale: run `make docs`"
    for s in SETTINGS:
        assert f"| `{s.name}` |" in text


def test_make_docs_rewrites_a_stale_table(tmp_path: Path) -> None:
    current = OPERATING_MD.read_text()
    stale = tmp_path / "operating.md"
    stale.write_text(current.replace("| `port` | `--port PORT` |", "| `port` | `--prot PORT` |"))
    assert settings.main(["--write", str(stale)]) == 0
    assert stale.read_text() == current


def test_responses_store_names_a_known_backend() -> None:
    for spec in ("memory", "none", "sqlite:/var/lib/extproc/responses.db", "postgres://u@db/extproc"):
        assert parse_responses_store(spec) == spec
    for bad in ("", "sqlite:", "mysql://db", "redis", 3):
        with pytest.raises(BadValue):
            parse_responses_store(bad)
