"""The example Wasm plugin (deploy/wasm/api-key-auth, Rust, proxy-wasm) loaded by the Envoy from PyPI (V8
runtime) in front of extproc, as an Istio or Envoy Gateway user would add it: a request without a valid
key gets the plugin's 401 and never reaches extproc's routing or an engine; one with a key is served."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.envoy_bootstrap import envoy_binary
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

PLUGIN = Path(__file__).resolve().parents[2] / "deploy" / "wasm" / "api-key-auth"
WASM = PLUGIN / "target" / "wasm32-wasip1" / "release" / "api_key_auth.wasm"
KEYS = {"team-a": "key-a-0123456789", "team-b": "key-b-9876543210"}


def build_plugin() -> Path:
    """`make wasm-plugin`'s build (a no-op when up to date); it needs Rust's wasm32-wasip1 target."""
    manifest = str(PLUGIN / "Cargo.toml")
    argv = ["cargo", "build", "--release", "--target", "wasm32-wasip1", "--manifest-path", manifest]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the plugin did not build (rustup target add wasm32-wasip1?):\n{run.stderr}"
    return WASM


def wasm_filter(wasm: Path, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "api-key-auth",
                "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": str(wasm)}}},
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": json.dumps(config),
                },
            },
        },
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    wasm = build_plugin()
    before = lambda addresses: [wasm_filter(wasm, {"keys": KEYS})]  # noqa: E731
    with local_stack(FreePorts(), tmp_path_factory.mktemp("wasm"), filters_before=before) as s:
        yield s


def chat(stack: Stack, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = post_json(stack.base_url, "/v1/chat/completions", body, headers=headers).getresponse()
    return response.status, json.loads(response.read())


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "wrong"}, {"x-api-key": KEYS["team-a"][:-1]}],
    ids=["none", "wrong", "prefix"],
)
def test_a_request_without_a_valid_key_is_401_before_extproc(stack: Stack, headers: dict[str, str]) -> None:
    status, body = chat(stack, headers)
    # The plugin's own answer, unchanged: Envoy runs the local reply's response through the filters
    # after the plugin, and extproc passes a reply to a request it never saw as it is.
    assert status == 401
    assert body["error"] == {
        "message": "a valid API key is required",
        "type": "authentication_error",
        "param": None,
        "code": 401,
    }
    assert stack.generate_requests() == 0


@pytest.mark.parametrize("team", sorted(KEYS))
def test_a_request_with_a_key_reaches_an_engine(stack: Stack, team: str) -> None:
    before = stack.generate_requests()
    status, body = chat(stack, {"x-api-key": KEYS[team]})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    assert stack.generate_requests() == before + 1


def test_a_configuration_without_keys_keeps_envoy_from_starting(tmp_path: Path) -> None:
    # A plugin that fails to configure must not leave the gateway open: Envoy refuses the config.
    wasm = build_plugin()
    config = {
        "static_resources": {
            "listeners": [
                {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "t",
                                        "route_config": {},
                                        "http_filters": [
                                            wasm_filter(wasm, {"keys": {}}),
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters."
                                                    "http.router.v3.Router"
                                                },
                                            },
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ]
        }
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    run = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert "no keys" in run.stderr or "Unable to create Wasm HTTP filter" in run.stderr, run.stderr[-2000:]
