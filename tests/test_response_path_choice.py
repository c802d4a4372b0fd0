"""`response_path = "auto"`: `up` and `envoy-config` answer through the Envoy module when it is built and
the Envoy binary can load it (it exports the callbacks the module calls and declares the module's ABI
version), else through ext_proc, and say why. Fake Envoy binaries stand for the ones that cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc import cli, envoy_bootstrap, envoy_module
from extproc.config import Settings

_CALLBACKS = b"\0".join(envoy_module._REQUIRED_CALLBACKS)


def _fake_envoy(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "envoy"
    path.write_bytes(b"\x7fELF" + b"\0" * 64 + content + b"\0" * 64)
    path.chmod(0o755)
    return path


@pytest.fixture
def built_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module directory holding a (stand-in) built module."""
    directory = tmp_path / "module"
    directory.mkdir()
    (directory / envoy_module.MODULE_FILE).write_bytes(b"\x7fELF")
    monkeypatch.setenv("EXTPROC_ENVOY_MODULE_DIR", str(directory))
    return directory


def _choose(monkeypatch: pytest.MonkeyPatch, envoy: Path, **settings: str) -> tuple[str, str]:
    monkeypatch.setenv("EXTPROC_ENVOY_BIN", str(envoy))
    settings.setdefault("response_path", "auto")
    chosen, why = envoy_bootstrap.choose_response_path(Settings(**settings))  # type: ignore[arg-type]
    return chosen.response_path, why


def test_auto_takes_the_module_when_envoy_can_load_it(
    tmp_path: Path, built_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envoy = _fake_envoy(tmp_path, b"\0" + _CALLBACKS + b"\0v0.2.0\0")
    path, why = _choose(monkeypatch, envoy)
    assert path == "module"
    assert envoy_module.MODULE_ABI_VERSION in why and str(envoy) in why


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"no modules here", "has no dynamic modules"),
        (b"\0" + _CALLBACKS + b"\0v0.3.0\0", "does not declare the module's dynamic-module ABI v0.2.0"),
    ],
    ids=["no-dynamic-modules", "other-abi"],
)
def test_auto_falls_back_to_ext_proc_and_says_why(
    tmp_path: Path, built_module: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, reason: str
) -> None:
    path, why = _choose(monkeypatch, _fake_envoy(tmp_path, content))
    assert path == "ext_proc"
    assert reason in why


def test_auto_without_a_built_module_is_ext_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTPROC_ENVOY_MODULE_DIR", str(tmp_path))
    monkeypatch.setattr(envoy_module, "_REPO", tmp_path)  # no source checkout's build either
    monkeypatch.setattr(envoy_module, "__file__", str(tmp_path / "envoy_module.py"))
    envoy = _fake_envoy(tmp_path, b"\0" + _CALLBACKS + b"\0v0.2.0\0")
    path, why = _choose(monkeypatch, envoy)
    assert (path, why) == ("ext_proc", "libextproc_envoy.so is not built (make envoy-module)")


def test_auto_without_an_envoy_binary_is_ext_proc(
    tmp_path: Path, built_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, why = _choose(monkeypatch, tmp_path / "missing")
    assert path == "ext_proc" and "cannot read the Envoy binary" in why


@pytest.mark.parametrize("asked", ["module", "ext_proc"])
def test_an_explicit_path_is_kept(
    tmp_path: Path, built_module: Path, monkeypatch: pytest.MonkeyPatch, asked: str
) -> None:
    envoy = _fake_envoy(tmp_path, b"nothing")
    assert _choose(monkeypatch, envoy, response_path=asked) == (asked, f"response_path = {asked}")


def test_the_wheels_envoy_loads_the_built_module() -> None:
    """The real pair: the Envoy 1.40 wheel and `make envoy-module`'s build, whose hooks declare the ABI
    version Python checks for."""
    directory = envoy_module.module_dir()
    assert directory is not None, "build it: make envoy-module"
    assert b"\0" + envoy_module.MODULE_ABI_VERSION.encode() + b"\0" in (
        b"\0" + (directory / envoy_module.MODULE_FILE).read_bytes()
    )
    assert envoy_module.unsupported_reason(envoy_bootstrap.envoy_binary()) is None
    chosen, _ = envoy_bootstrap.choose_response_path(Settings(response_path="auto"))
    assert chosen.response_path == "module"


def _filters(config: dict) -> list[dict]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm["http_filters"]


def test_envoy_config_takes_the_module_when_auto_and_ext_proc_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["envoy-config", "--response-path", "auto", "-o", str(tmp_path / "auto.json")]) == 0
    assert "extproc: response path: module (" in capsys.readouterr().err
    auto = json.loads((tmp_path / "auto.json").read_text())
    names = [f["name"] for f in _filters(auto)]
    assert names == [
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.dynamic_modules",
        "envoy.filters.http.router",
    ]
    # Envoy tells extproc on every ext_proc stream that the module answers.
    service = _filters(auto)[0]["typed_config"]["grpc_service"]
    assert service["initial_metadata"] == [{"key": "x-extproc-response-path", "value": "module"}]
    envoy_bootstrap.validate_config(tmp_path / "auto.json")

    # The default is auto: the module, where this Envoy loads it.
    assert cli.main(["envoy-config", "-o", str(tmp_path / "default.json")]) == 0
    default = json.loads((tmp_path / "default.json").read_text())
    assert [f["name"] for f in _filters(default)] == names
    assert cli.main(["envoy-config", "--response-path", "ext_proc", "-o", str(tmp_path / "ext.json")]) == 0
    assert "extproc: response path: ext_proc (response_path = ext_proc)" in capsys.readouterr().err
    ext = json.loads((tmp_path / "ext.json").read_text())
    assert [f["name"] for f in _filters(ext)] == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    assert "initial_metadata" not in _filters(ext)[0]["typed_config"]["grpc_service"]


def test_envoy_config_falls_back_when_envoy_cannot_load_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXTPROC_ENVOY_BIN", str(_fake_envoy(tmp_path, b"an old envoy")))
    assert cli.main(["envoy-config", "--response-path", "auto", "-o", str(tmp_path / "out.json")]) == 0
    err = capsys.readouterr().err
    assert "extproc: response path: ext_proc (" in err and "has no dynamic modules" in err
    names = [f["name"] for f in _filters(json.loads((tmp_path / "out.json").read_text()))]
    assert "envoy.filters.http.dynamic_modules" not in names


@pytest.mark.parametrize(("envoy_content", "expected"), [(None, "module"), (b"an old envoy", "ext_proc")])
def test_up_says_which_path_it_runs_and_builds_its_stack_with_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    free_ports,
    envoy_content: bytes | None,
    expected: str,
) -> None:
    from extproc import stack

    if envoy_content is not None:
        monkeypatch.setenv("EXTPROC_ENVOY_BIN", str(_fake_envoy(tmp_path, envoy_content)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    seen: list[Settings] = []

    def specs(settings: Settings, run_dir: Path) -> None:
        seen.append(settings)
        raise stack.StackError("stopped before starting anything")

    monkeypatch.setattr(stack, "stack_specs", specs)
    out, err = tmp_path / "out", tmp_path / "err"
    port, sim_port, admin, listen, metrics = (free_ports.one() for _ in range(5))
    settings = Settings(
        port=port,
        sim_port=sim_port,
        admin_port=admin,
        listen=f"127.0.0.1:{listen}",
        metrics_port=metrics,
        response_path="auto",
    )
    with out.open("w") as o, err.open("w") as e:
        assert stack.run_stack(settings, o, e) == 1
    assert seen[0].response_path == expected
    assert f"extproc: response path: {expected} (" in err.read_text()
