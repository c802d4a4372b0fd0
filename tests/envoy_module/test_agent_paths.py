"""Agent answers on both response paths in the same bytes: tool calls streamed name first (Hermes,
Kimi K2, GLM over SGLang's protocol) and `include_reasoning: false`, through a
stack whose responses extproc translates and one whose responses the Envoy module translates, streamed
and whole. The formats and their scripted engines are tests/integration/test_agent_responses.py's; call
ids are random per answer (Kimi K2's excepted) and set aside like `id` and `created`."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.envoy_module.test_response_paths import _neutral
from tests.integration.harness import SimModel, Stack, local_stack
from tests.integration.test_agent_responses import BY_MODEL, QUESTION, WEATHER_TOOL, model_dir

# Hermes (JSON arguments streamed as they come), Kimi K2 (its own call ids), GLM (SGLang protocol).
NAME_FIRST = ["qwen2.5-hermes", "kimi-k2", "glm-4.5-sglang"]
THINKING = "qwen3-think"
_CALL_ID = re.compile(rb'"id":"call_[A-Za-z0-9]{24}"')


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    root = tmp_path_factory.mktemp("agent-models")
    formats = [BY_MODEL[name] for name in [*NAME_FIRST, THINKING]]
    models = [
        SimModel(
            f.model,
            engines=1,
            model_dir=model_dir(root, f),
            sim=SimOptions(ttft_ms=1, itl_ms=0.2, script=[{"match": "weather in Paris", "text": f.text}]),
            tool_parser=f.tool_parser,
            reasoning_parser=f.reasoning_parser,
            protocol=f.protocol,
        )
        for f in formats
    ]
    ports = FreePorts()
    with local_stack(ports, Path(tmp_path_factory.mktemp("ext_proc")), models=models) as reference:
        with local_stack(
            ports, Path(tmp_path_factory.mktemp("module")), models=models, response_path="module"
        ) as module:
            yield {"ext_proc": reference, "module": module}


def _answer(stack: Stack, body: dict[str, Any]) -> tuple[int, bytes]:
    url = urlparse(stack.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, _CALL_ID.sub(b'"id":"call_x"', _neutral(response.read()))
    finally:
        conn.close()


def _both(stacks: dict[str, Stack], body: dict[str, Any]) -> bytes:
    (status, reference), (module_status, got) = (_answer(stacks[p], body) for p in ("ext_proc", "module"))
    assert (module_status, got) == (status, reference)
    assert status == 200
    return got


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("model", NAME_FIRST)
def test_tool_calls_come_back_in_the_same_bytes(stacks: dict[str, Stack], model: str, stream: bool) -> None:
    body = {"model": model, "messages": QUESTION, "tools": [WEATHER_TOOL], "stream": stream}
    got = _both(stacks, body)
    if stream:
        # Name first: the call's name comes in an event before its arguments are complete.
        chunks = [e for e in got.split(b"\n\n") if e.startswith(b"data: {")]
        events = [json.loads(e.removeprefix(b"data: ")) for e in chunks]
        calls = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls") or []]
        assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
        assert len(calls) >= 3, calls
    else:
        assert json.loads(got)["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_include_reasoning_false_comes_back_in_the_same_bytes(stacks: dict[str, Stack], stream: bool) -> None:
    body = {
        "model": THINKING,
        "messages": QUESTION,
        "tools": [WEATHER_TOOL],
        "stream": stream,
        "include_reasoning": False,
    }
    got = _both(stacks, body)
    assert b"The user wants the weather" not in got
    if not stream:
        assert json.loads(got)["choices"][0]["message"]["content"].strip() == "Let me check."
