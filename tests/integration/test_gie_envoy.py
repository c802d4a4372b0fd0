"""deploy/gie/envoy-gie.yaml, Envoy configured as a Gateway API Inference Extension gateway would be (ext_proc
in front, an ORIGINAL_DST cluster on `x-gateway-destination-endpoint`), running with extproc as the
InferencePool's endpoint picker and two simulated engines: requests reach both engines through it, a
client cannot pick the engine, no ready engine is a 503, and with the picker down the gateway fails
closed."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from extproc.envoy_bootstrap import envoy_binary
from tests.conftest import FreePorts
from tests.gie.picker import Picker, running_picker
from tests.integration.harness import envoy_running, post_json

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "gie" / "envoy-gie.yaml"


@dataclass
class GieStack:
    picker: Picker
    base_url: str

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=20)

    def ask(self, text: str, headers: dict[str, str] | None = None) -> str:
        reply = self.openai().chat.completions.create(
            model=self.picker.model,
            messages=[{"role": "user", "content": text}],
            max_tokens=3,
            extra_headers=headers,
        )
        return reply.choices[0].message.content or ""


def _socket(config: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    node: Any = config
    for key in path:
        node = node[key]
    socket: dict[str, Any] = node["address"]["socket_address"]
    return socket


def gie_config(listen_port: int, admin_port: int, picker_address: str) -> dict[str, Any]:
    """The reference config with this test's ports and picker address, nothing else changed."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    _socket(config, ["admin"])["port_value"] = admin_port
    listener = _socket(config, ["static_resources", "listeners", 0])
    listener.update(address="127.0.0.1", port_value=listen_port)
    (picker,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "endpoint-picker"]
    endpoint = picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    host, port = picker_address.rsplit(":", 1)
    endpoint["address"]["socket_address"].update(address=host, port_value=int(port))
    return config


@contextlib.contextmanager
def gie_stack(tmp: Path) -> Iterator[GieStack]:
    ports = FreePorts()
    listen_port, admin_port = ports.one(), ports.one()
    with running_picker(engines=2, routing_policy="round_robin") as picker:
        path = tmp / "envoy-gie.json"
        path.write_text(json.dumps(gie_config(listen_port, admin_port, picker.running.address)))
        with envoy_running(path, admin_port):
            yield GieStack(picker, f"http://127.0.0.1:{listen_port}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GieStack]:
    with gie_stack(tmp_path_factory.mktemp("gie")) as s:
        yield s


def test_the_reference_config_is_valid_for_envoy() -> None:
    run = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_requests_through_the_gateway_reach_both_engines(stack: GieStack) -> None:
    engines = stack.picker.engines.engines
    before = [e.stats.completed for e in engines]
    for i in range(4):
        assert stack.ask(f"question {i}")
    assert [e.stats.completed - b for e, b in zip(engines, before, strict=True)] == [2, 2]


def test_a_streamed_answer_comes_through_as_server_sent_events(stack: GieStack) -> None:
    chunks = stack.openai().chat.completions.create(
        model=stack.picker.model,
        messages=[{"role": "user", "content": "stream"}],
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_a_clients_destination_header_does_not_choose_the_engine(stack: GieStack) -> None:
    # Nothing listens on port 9: had Envoy connected there, the request would fail.
    assert stack.ask("mine", headers={"x-gateway-destination-endpoint": "127.0.0.1:9"})


def test_no_ready_engine_is_a_503_from_the_picker(stack: GieStack) -> None:
    picker = stack.picker
    for engine in picker.engines.engines:
        picker.set_ready(engine, False)
    try:
        body = {"model": picker.model, "messages": [{"role": "user", "content": "x"}]}
        answer = post_json(stack.base_url, "/v1/chat/completions", body).getresponse()
        payload = json.loads(answer.read())
    finally:
        for engine in picker.engines.engines:
            picker.set_ready(engine, True)
    assert answer.status == 503
    assert payload["error"]["type"] == "service_unavailable"
    assert "no engine is ready" in payload["error"]["message"]


def test_with_the_picker_down_the_gateway_fails_closed(tmp_path: Path) -> None:
    with gie_stack(tmp_path) as stack:
        picker = stack.picker
        assert stack.ask("up")
        served = picker.generate_requests()
        picker.loop.run(picker.running.stop(grace=0))
        body = {"model": picker.model, "messages": [{"role": "user", "content": "x"}]}
        answer = post_json(stack.base_url, "/v1/chat/completions", body).getresponse()
        answer.read()
        assert answer.status in (500, 503)
        assert picker.generate_requests() == served, "nothing reached an engine without the picker"
