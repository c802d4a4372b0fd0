"""The Envoy from the PyPI wheel (1.40) loads extproc's dynamic module and lets it rewrite a response body:
the `probe` filter appends its config's bytes to whatever the upstream answers."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc import envoy_bootstrap as eb
from extproc import envoy_module


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _bootstrap(listen: int, admin: int, upstream: int, suffix: str) -> dict:
    probe = {
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3"
            ".DynamicModuleFilter",
            "dynamic_module_config": {"name": envoy_module.MODULE_NAME},
            "filter_name": "probe",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": suffix},
        },
    }
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
        ".HttpConnectionManager",
        "stat_prefix": "probe",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "up"}}],
                }
            ]
        },
        "http_filters": [probe, router],
    }
    endpoint = {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "up",
                    "type": "STATIC",
                    "load_assignment": {"cluster_name": "up", "endpoints": [{"lb_endpoints": [endpoint]}]},
                }
            ],
        },
    }


@contextlib.contextmanager
def _envoy(tmp_path: Path, config: dict, admin: int, module_dir: Path) -> Iterator[Path]:
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    log_path = tmp_path / "envoy.log"
    env = {**os.environ, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(module_dir)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [eb.envoy_binary(), "-c", str(path), "--disable-hot-restart", "--log-level", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "Envoy did not become ready"
                time.sleep(0.1)
            yield log_path
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def module_dir() -> Path:
    found = envoy_module.module_dir()
    assert found is not None, "build it: make envoy-module"
    return found


def test_envoy_loads_the_module_and_it_rewrites_the_body(
    tmp_path: Path, free_ports: Any, module_dir: Path
) -> None:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", free_ports.one()), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    listen, admin = free_ports.one(), free_ports.one()
    try:
        config = _bootstrap(listen, admin, upstream.server_address[1], "!\n")
        with _envoy(tmp_path, config, admin, module_dir) as log:
            with urllib.request.urlopen(f"http://127.0.0.1:{listen}/x", timeout=10) as resp:
                assert resp.status == 200
                assert resp.read() == b"hello!\n"
        # The ABI version the module declares is the one this Envoy carries (else Envoy warns).
        assert "ABI version v0.2.0 matched" in log.read_text()
    finally:
        upstream.shutdown()
        upstream.server_close()
