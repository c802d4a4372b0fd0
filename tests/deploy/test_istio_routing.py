"""The Istio routing of deploy/istio, run for real: the ingress gateway's Envoy as Istio would configure it
from the VirtualService, ServiceEntry, DestinationRule and EnvoyFilter (tests/deploy/istio_gateway.py),
in front of a real extproc and two simulated engines. Requests reach the engine extproc picked through
the ORIGINAL_DST cluster and the destination header, a client's own destination header is ignored, and
extproc's own answers come back unchanged."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from extproc import server
from extproc.config import Settings
from extproc.envoy_bootstrap import split_host_port
from extproc.simulator import SimCluster
from tests.conftest import DEFAULT_MODEL, FreePorts
from tests.deploy import istio_gateway
from tests.deploy.kustomize import render
from tests.integration.harness import LoopThread, SimModel, _start_clusters, _stop_clusters, envoy_running

REPO = Path(__file__).resolve().parents[2]


@dataclass
class IstioStack:
    base_url: str
    engines: SimCluster


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IstioStack]:
    ports = FreePorts()
    loop = LoopThread()
    clusters = loop.run(_start_clusters([SimModel(DEFAULT_MODEL, engines=2)], None))
    engines = clusters[DEFAULT_MODEL]
    settings = Settings(listen="127.0.0.1:0", engines=tuple(f"grpc://{a}" for a in engines.addresses))
    running = loop.run(server.start(settings, engine_wait_s=10))
    try:
        host, port = split_host_port(running.address)
        at = istio_gateway.GatewayAddresses(
            listen_host="127.0.0.1",
            listen_port=ports.one(),
            admin_port=ports.one(),
            extproc_host=host,
            extproc_port=port,
        )
        config = Path(tmp_path_factory.mktemp("istio")) / "gateway.json"
        config.write_text(json.dumps(istio_gateway.bootstrap(render(REPO / "deploy/istio"), at)))
        assert at.admin_port is not None
        with envoy_running(config, at.admin_port):
            yield IstioStack(f"http://127.0.0.1:{at.listen_port}", engines)
    finally:
        loop.run(running.stop(0))
        loop.run(_stop_clusters(clusters, 0))
        loop.close()


def _post(url: str, body: dict[str, object], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _chat(stream: bool = False) -> dict[str, object]:
    return {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": 8,
        "stream": stream,
    }


def _generated(stack: IstioStack) -> int:
    return sum(e.stats.generate_requests for e in stack.engines.engines)


def test_a_chat_completion_reaches_an_engine_through_the_destination_header(stack: IstioStack) -> None:
    before = _generated(stack)
    status, body = _post(f"{stack.base_url}/v1/chat/completions", _chat())
    assert status == 200, body
    answer = json.loads(body)
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] == 8
    assert _generated(stack) == before + 1


def test_a_streamed_completion_ends_with_done(stack: IstioStack) -> None:
    status, body = _post(f"{stack.base_url}/v1/chat/completions", _chat(stream=True))
    assert status == 200
    events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) > 2


def test_a_clients_own_destination_header_is_ignored(stack: IstioStack) -> None:
    """The early header mutation removes it: a client cannot send its request to an address of its
    choosing (here a port nothing listens on), extproc's pick is used."""
    before = _generated(stack)
    headers = {"x-gateway-destination-endpoint": "127.0.0.1:1", "x-envoy-max-retries": "5"}
    status, body = _post(f"{stack.base_url}/v1/chat/completions", _chat(), headers)
    assert status == 200, body
    assert _generated(stack) == before + 1


def test_extproc_answers_models_itself(stack: IstioStack) -> None:
    with urllib.request.urlopen(f"{stack.base_url}/v1/models", timeout=10) as response:
        models = json.loads(response.read())
    assert [m["id"] for m in models["data"]] == [DEFAULT_MODEL]


def test_a_bad_request_gets_extprocs_error_not_the_fallback_route(stack: IstioStack) -> None:
    status, body = _post(f"{stack.base_url}/v1/chat/completions", {"model": DEFAULT_MODEL})
    assert status == 400
    assert json.loads(body)["error"]["param"] == "messages"
