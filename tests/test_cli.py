"""The `extproc` command line: parsing, errors (exit 2, one line), envoy-config, and wiring of up/serve."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from extproc import cli, envoy_bootstrap
from extproc.config import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EXTPROC_CONFIG", "EXTPROC_PORT", "EXTPROC_ENGINES", "EXTPROC_LISTEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "argv", [["--help"], ["up", "--help"], ["serve", "--help"], ["envoy-config", "--help"]]
)
def test_help_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: extproc")
    if argv[0] == "up":
        for flag in ("--port", "--admin-port", "--listen", "--model-dir", "--engine", "--sim", "--config"):
            assert flag in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("extproc ")


def test_missing_or_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["launch"]) == 2
    assert cli.main(["up", "--no-such-flag"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--port", "abc"], "extproc: invalid --port 'abc': expected an integer 1-65535"),
        (["up", "--sim", "-3"], "extproc: invalid --sim '-3': expected an integer 0-1024"),
        (
            ["serve", "--engine", "http://x:1"],
            "extproc: invalid --engine 'http://x:1': expected grpc://IP:port",
        ),
        (
            ["serve"],
            "extproc: serve needs at least one engine: --engine grpc://host:port (or EXTPROC_ENGINES)",
        ),
        (["envoy-config", "--listen", "nowhere"], "extproc: invalid --listen 'nowhere': expected host:port"),
    ],
)
def test_bad_settings_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_bad_environment_and_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXTPROC_PORT", "eighty")
    assert cli.main(["envoy-config"]) == 2
    assert "invalid EXTPROC_PORT 'eighty'" in capsys.readouterr().err
    monkeypatch.delenv("EXTPROC_PORT")
    config = tmp_path / "c.toml"
    config.write_text("colour = 1\n")
    assert cli.main(["envoy-config", "--config", str(config)]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err


def test_envoy_config_prints_a_valid_bootstrap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["envoy-config", "--port", "8181", "--admin-port", "9191", "--listen", "unix:/tmp/e.sock"])
        == 0
    )
    text = capsys.readouterr().out
    config = json.loads(text)
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener["port_value"] == 8181
    assert config["admin"]["address"]["socket_address"]["port_value"] == 9191
    path = tmp_path / "envoy.json"
    path.write_text(text)
    envoy_bootstrap.validate_config(path)


def test_envoy_config_defaults_match_the_checked_in_config(capsys: pytest.CaptureFixture[str]) -> None:
    # Engines unknown to the printed config: one address per request (ORIGINAL_DST); the module's config
    # names this machine's paths, so the checked-in one is ext_proc's.
    assert cli.main(["envoy-config", "--response-path", "ext_proc"]) == 0
    assert capsys.readouterr().out == (Path(__file__).parents[1] / "envoy" / "original-dst.json").read_text()


def test_envoy_config_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text('port = 7001\nlisten = "127.0.0.1:7002"\n')
    monkeypatch.setenv("EXTPROC_CONFIG", str(config))
    monkeypatch.setenv("EXTPROC_PORT", "7003")
    out = tmp_path / "out.json"
    assert cli.main(["envoy-config", "-o", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 7003
    extproc = next(c for c in written["static_resources"]["clusters"] if c["name"] == "extproc")
    address = extproc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"]["port_value"] == 7002


def test_serve_runs_the_server_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Settings] = []

    async def serve(settings: Settings) -> None:
        seen.append(settings)

    monkeypatch.setitem(sys.modules, "extproc.server", types.SimpleNamespace(serve=serve))
    logging_set: list[tuple[str, str]] = []
    # No global logging changes here.
    monkeypatch.setattr(cli, "_configure_logging", lambda level, fmt: logging_set.append((level, fmt)))
    argv = [
        "serve",
        "--engine",
        "grpc://127.0.0.1:1",
        "--engine",
        "grpc://127.0.0.1:2",
        "--listen",
        "unix:/x",
        "--log-format",
        "json",
    ]
    assert cli.main(argv) == 0
    assert seen[0].engines == ("grpc://127.0.0.1:1", "grpc://127.0.0.1:2")
    assert seen[0].listen == "unix:/x"
    assert logging_set == [("info", "json")]


def test_json_logs_are_one_json_object_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import structlog

    try:
        cli._configure_logging("info", "json")
        structlog.get_logger("t").info("request", request_id="r-1", status=200)
        structlog.get_logger("t").debug("filtered out")
    finally:
        structlog.reset_defaults()
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record["event"] == "request" and record["request_id"] == "r-1" and record["status"] == 200
    assert record["level"] == "info" and record["timestamp"].endswith("Z")


def test_up_hands_settings_to_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    from extproc import stack

    seen: list[Settings] = []
    monkeypatch.setattr(stack, "run_stack", lambda settings: seen.append(settings) or 7)
    assert cli.main(["up", "--port", "8123", "--sim", "3", "--sim-port", "40000"]) == 7
    assert (seen[0].port, seen[0].sim, seen[0].sim_port, seen[0].engines) == (8123, 3, 40000, ())


def test_up_refuses_a_busy_port(free_ports, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["up", "--port", str(port), "--admin-port", str(free_ports.one())]
        argv += ["--listen", f"127.0.0.1:{free_ports.one()}", "--sim-port", str(free_ports.block(2))]
        assert cli.main(argv) == 1
    assert f"--port address 127.0.0.1:{port} is not available" in capsys.readouterr().err


def test_up_refuses_overlapping_ports(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["up", "--port", "50100", "--sim-port", "50099"]) == 1
    assert "uses port 50100, which --port already uses" in capsys.readouterr().err


def test_cli_stays_light() -> None:
    """No Rust extension, server or gRPC import just to parse flags or print the Envoy config."""
    code = (
        "import sys\n"
        "from extproc.cli import main\n"
        "assert main(['envoy-config', '-o', '/dev/null']) == 0\n"
        "heavy = {'extproc._native', 'extproc.server', 'grpc'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_zmq_is_imported_only_for_an_engine_that_uses_it(tmp_path: Path) -> None:
    """pyzmq is a dependency, but settings and the pool without ZMQ sources leave it unimported."""
    grpc_only = tmp_path / "grpc.toml"
    grpc_only.write_text('[[models]]\nengines = [{ url = "grpc://10.0.0.1:1", kv_events = "off" }]\n')
    with_zmq = tmp_path / "zmq.toml"
    with_zmq.write_text('[[models]]\nengines = [{ url = "grpc://10.0.0.1:1", kv_events = "zmq://h:5557" }]\n')
    code = (
        "import sys\n"
        "from extproc.config import load_settings\n"
        "import extproc.pool\n"
        f"load_settings(config_file={str(grpc_only)!r}, env={{}})\n"
        "assert 'zmq' not in sys.modules\n"
        f"load_settings(config_file={str(with_zmq)!r}, env={{}})\n"
        "assert 'zmq' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_python_dash_m_extproc() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "extproc", "up", "--port", "x"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert proc.returncode == 2
    assert proc.stderr == "extproc: invalid --port 'x': expected an integer 1-65535\n"


def test_sim_hands_its_arguments_to_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sim", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--protocol" in out and "--engines" in out
    assert cli.main(["sim", "--engines", "2"]) == 2  # --port is required by the simulator


def test_serve_and_up_take_the_protocol_and_load_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("serve", "up"):
        assert cli.main([command, "--help"]) == 0
        out = capsys.readouterr().out
        assert "--engine-protocol" in out and "--load-interval" in out and "[[models]]" in out


def test_serve_needs_engines_for_every_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[[models]]\nname = "a"\nengines = ["grpc://127.0.0.1:1"]\n[[models]]\nname = "b"\n')
    assert cli.main(["serve", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "extproc: serve needs engines for every model: 'b' has none (engines = [...])\n"
    )


def test_bad_models_table_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[[models]]\nname = "a"\n[[models]]\nname = "a"\n')
    assert cli.main(["up", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("extproc: invalid models in ") and "are both named 'a'" in err
    assert err.count("\n") == 1


def test_up_plans_a_simulator_per_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extproc import stack
    from extproc.config import load_settings

    config = tmp_path / "c.toml"
    config.write_text(
        'sim_port = 41000\nsim = 2\nrouting_policy = "least_load"\n'
        '[[models]]\nname = "alpha"\n'
        '[[models]]\nname = "beta"\nsim = 1\nengine_protocol = "sglang"\n'
        '[[models]]\nname = "gamma"\nengines = ["grpc://10.0.0.9:1"]\n'
    )
    monkeypatch.setenv("EXTPROC_CACHE_DIR", str(tmp_path / "cache"))
    settings = load_settings(config_file=config, env={})
    specs, served, sims = stack.stack_specs(settings, tmp_path)
    assert [s.name for s in specs] == ["sim-alpha", "sim-beta", "server", "envoy"]
    alpha, beta = specs[0].argv, specs[1].argv
    assert alpha[alpha.index("--port") + 1 :][:3] == ["41000", "--engines", "2"]
    assert beta[beta.index("--port") + 1 :][:3] == ["41002", "--engines", "1"]
    assert beta[beta.index("--protocol") + 1] == "sglang" and beta[beta.index("--model-name") + 1] == "beta"
    # The server reads the resolved models from a generated file: simulated engines filled in.
    server = specs[2].argv
    models_file = Path(server[server.index("--config") + 1])
    reread = load_settings(config_file=models_file, env={})
    assert [(m.name, [e.url for e in m.engines], m.routing_policy) for m in reread.models] == [
        ("alpha", ["grpc://127.0.0.1:41000", "grpc://127.0.0.1:41001"], "least_load"),
        ("beta", ["grpc://127.0.0.1:41002"], "least_load"),
        ("gamma", ["grpc://10.0.0.9:1"], "least_load"),
    ]
    assert [e.protocol for e in reread.models[1].engines] == ["sglang"]
    # Envoy knows every engine, so extproc lists fallbacks (one: alpha's other engine) for every model.
    assert server[server.index("--destination-fallbacks") + 1] == "1"
    assert stack.describe(served, sims) == (
        "models alpha (2 simulated engines), beta (1 simulated engine), gamma (1 engine)"
    )


def test_up_hands_the_single_model_settings_to_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from extproc import stack
    from extproc.config import load_settings

    monkeypatch.setenv("EXTPROC_CACHE_DIR", str(tmp_path / "cache"))
    flags = {"routing_policy": "round_robin", "engine_protocol": "sglang", "load_interval": "2", "sim": "1"}
    specs, served, sims = stack.stack_specs(load_settings(flags, env={}), tmp_path)
    assert [s.name for s in specs] == ["sim", "server", "envoy"]
    assert specs[0].argv[specs[0].argv.index("--protocol") + 1] == "sglang"
    server = specs[1].argv
    for flag, value in [
        ("--routing-policy", "round_robin"),
        ("--engine-protocol", "sglang"),
        ("--load-interval", "2.0"),
        ("--destination-fallbacks", "0"),
    ]:
        assert server[server.index(flag) + 1] == value
    assert stack.describe(served, sims) == "model llama3-default, 1 simulated engine"


def test_up_gives_the_simulators_its_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extproc import stack
    from extproc.config import load_settings
    from extproc.supervisor import StackError

    monkeypatch.setenv("EXTPROC_CACHE_DIR", str(tmp_path / "cache"))
    script = tmp_path / "script.json"
    script.write_text('[{"match": "weather", "text": "sunny"}]')
    specs, _, _ = stack.stack_specs(load_settings({"sim_script": str(script)}, env={}), tmp_path)
    assert specs[0].argv[specs[0].argv.index("--script") + 1] == f"@{script}"
    script.write_text('[{"match": "weather"')
    with pytest.raises(StackError, match=r"sim_script .*script\.json"):
        stack.stack_specs(load_settings({"sim_script": str(script)}, env={}), tmp_path)


def test_up_stores_responses_in_its_state_dir_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from extproc import stack
    from extproc.config import load_settings

    monkeypatch.setenv("EXTPROC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))

    def store(flags: dict[str, str]) -> str:
        specs, _, _ = stack.stack_specs(load_settings({"sim": "1", **flags}, env={}), tmp_path)
        server = specs[1].argv
        return server[server.index("--responses-store") + 1]

    assert store({}) == f"sqlite:{tmp_path / 'xdg-state' / 'extproc' / 'responses.db'}"
    assert store({"state_dir": str(tmp_path / "st")}) == f"sqlite:{tmp_path / 'st' / 'responses.db'}"
    assert store({"state_dir": str(tmp_path / "st"), "responses_store": "memory"}) == "memory"
    # `serve` alone keeps memory: unset reaches the server as unset.
    assert load_settings({}, env={}).responses_store is None


def test_serve_refuses_unknown_router_settings_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # The router itself checks the keys (the real extension, before any engine is contacted).
    argv = ["serve", "--engine", "grpc://127.0.0.1:1", "--routing-config", '{"no_such_knob": 1}']
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "extproc: model 'llama3-default': invalid routing config: unknown field `no_such_knob`"
    )
    assert err.count("\n") == 1


def test_envoy_config_with_engines_follows_fallbacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "envoy.json"
    argv = ["envoy-config", "--engine", "grpc://10.0.0.1:1", "--engine", "grpc://10.0.0.2:2", "-o", str(out)]
    assert cli.main([*argv, "--engine", "grpc://10.0.0.3:3", "--destination-fallbacks", "1"]) == 0
    written = json.loads(out.read_text())
    engines = next(c for c in written["static_resources"]["clusters"] if c["name"] == "engines")
    assert engines["type"] == "STATIC"
    hosts = [
        e["endpoint"]["address"]["socket_address"]
        for e in engines["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert [(h["address"], h["port_value"]) for h in hosts] == [
        ("10.0.0.1", 1),
        ("10.0.0.2", 2),
        ("10.0.0.3", 3),
    ]
    route = written["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    to_engine = route["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert to_engine["retry_policy"]["num_retries"] == 1
    # Without engines Envoy cannot follow a list: refused in one line.
    assert cli.main(["envoy-config", "--destination-fallbacks", "2"]) == 2
    assert "needs the engines" in capsys.readouterr().err


def test_envoy_config_with_discovered_engines_reaches_them_by_the_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DNS names and Kubernetes Services cannot be listed in the config: Envoy takes each engine's
    address from extproc's header (ORIGINAL_DST), so fallbacks cannot be followed."""
    out = tmp_path / "envoy.json"
    argv = ["envoy-config", "--engine", "grpc://10.0.0.1:1", "--engine", "k8s://ns/vllm:grpc", "-o", str(out)]
    assert cli.main(argv) == 0
    capsys.readouterr()  # the response path it took
    engines = next(
        c for c in json.loads(out.read_text())["static_resources"]["clusters"] if c["name"] == "engines"
    )
    assert engines["type"] == "ORIGINAL_DST" and "load_assignment" not in engines
    assert cli.main([*argv, "--destination-fallbacks", "1"]) == 2
    err = capsys.readouterr().err
    assert "k8s://ns/vllm:grpc is discovered at run time" in err and err.count("\n") == 1


def test_up_with_discovered_engines_gives_envoy_no_static_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from extproc import stack
    from extproc.config import load_settings

    monkeypatch.setenv("EXTPROC_CACHE_DIR", str(tmp_path / "cache"))
    flags = {
        "engines": ["grpc://10.0.0.1:1", "k8s://ns/vllm:grpc"],
        "kubernetes_api": "http://127.0.0.1:8001",
    }
    specs, served, sims = stack.stack_specs(load_settings(flags, env={}), tmp_path)
    assert [s.name for s in specs] == ["server", "envoy"]
    server = specs[0].argv
    assert [server[i + 1] for i, a in enumerate(server) if a == "--engine"] == [
        "grpc://10.0.0.1:1",
        "k8s://ns/vllm:grpc",
    ]
    assert server[server.index("--kubernetes-api") + 1] == "http://127.0.0.1:8001"
    assert server[server.index("--destination-fallbacks") + 1] == "0"
    assert stack.known_engines(served) == ((), 0)
    envoy = json.loads((tmp_path / "envoy.json").read_text())
    engines = next(c for c in envoy["static_resources"]["clusters"] if c["name"] == "engines")
    assert engines["type"] == "ORIGINAL_DST"
    assert (
        stack.describe(served, sims) == "model llama3-default, 1 engine and engines from k8s://ns/vllm:grpc"
    )


def test_envoy_config_with_eds_from_extproc_follows_fallbacks_to_discovered_engines(tmp_path: Path) -> None:
    out = tmp_path / "envoy.json"
    argv = [
        "envoy-config",
        "--engine",
        "k8s://ns/vllm",
        "--xds-listen",
        "extproc.gw.svc:18000",
        "-o",
        str(out),
    ]
    assert cli.main([*argv, "--destination-fallbacks", "2"]) == 0
    clusters = {c["name"]: c for c in json.loads(out.read_text())["static_resources"]["clusters"]}
    assert clusters["engines"]["type"] == "EDS"
    xds = clusters["extproc_xds"]
    assert xds["type"] == "STRICT_DNS"
    address = xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"
    ]
    assert (address["address"], address["port_value"]) == ("extproc.gw.svc", 18000)
    written = json.loads(out.read_text())
    route = written["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert route["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]["num_retries"] == 2
