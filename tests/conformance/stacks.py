"""The stacks of the conformance suite: the official `openai` client → real Envoy → extproc → engines.

- simulated engines (either protocol) come from `tests.integration.harness.local_stack`, serving one
  model whose chat template is the default one plus an `enable_thinking` switch (`conformance_model`),
  so `chat_template_kwargs` has an effect a client can see;
- `gateway_in_front_of` puts extproc and a real Envoy in front of engines that already run (the real
  vLLM CPU engine), as `local_stack` does for the simulator's.

`EngineSpy` records every GenerateRequest the simulated engines receive, by request id (the id the
gateway sends is the one in the response's `id`), so tests can check what the engine was asked for
parameters the simulator does not model (temperature, top_p, penalties, logit_bias, ...).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from google.protobuf.message import Message

import extproc.simulator.engine as sim_vllm
import extproc.simulator.sglang as sim_sglang
from extproc import server
from extproc.config import Settings
from extproc.envoy_bootstrap import EnvoyOptions, render_bootstrap
from extproc.models import default_model_dir
from tests.conftest import FreePorts
from tests.integration.harness import LoopThread, envoy_running

PROTOCOLS = ("vllm", "sglang")
MODEL_NAME = "conformance"
# Appended to the default chat template: `chat_template_kwargs={"enable_thinking": False}` closes an
# empty thinking block after the generation prompt (the switch Qwen3-style templates have).
THINKING_SWITCH = (
    "\n{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}\n"
    "{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "{%- endif %}\n"
)
EMPTY_THINKING = "<think>\n\n</think>\n\n"


# As the harness runs Envoy: several stacks side by side, one worker.
class EngineSpy:
    """Every GenerateRequest the simulated engines received (either protocol), by request id."""

    def __init__(self) -> None:
        self.requests: dict[str, Message] = {}

    def record(self, request: Message) -> None:
        self.requests[request.request_id] = request  # type: ignore[attr-defined]

    def request_for(self, response_id: str) -> Any:
        """The engine request behind a response id (`chatcmpl-<id>` or `cmpl-<id>`)."""
        request_id = response_id.split("-", 1)[1]
        assert request_id in self.requests, f"no engine request {request_id!r} was recorded"
        return self.requests[request_id]

    @contextlib.contextmanager
    def installed(self) -> Iterator[EngineSpy]:
        """Wrap the simulator's entry points (looked up per call) so each request is recorded first."""
        vllm_admit = sim_vllm.admit
        sglang_as_vllm = sim_sglang._as_vllm

        async def admit(core: Any, request: Any, context: Any, check: Any = None) -> Any:
            self.record(request)
            return await vllm_admit(core, request, context, check)

        def as_vllm(request: Any) -> Any:
            self.record(request)
            return sglang_as_vllm(request)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sim_vllm, "admit", admit)
            patch.setattr(sim_sglang, "_as_vllm", as_vllm)
            yield self


@dataclass
class Gateway:
    """One stack as a client sees it, plus the means to look behind it."""

    base_url: str
    model: str
    protocol: str  # the engines' protocol: "vllm" or "sglang"
    engine: str  # "sim" or "vllm" (the real engine)
    model_dir: Path
    spy: EngineSpy | None = None
    generate_requests: Callable[[], int] | None = None
    _client: openai.OpenAI | None = field(default=None, repr=False)

    @property
    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = openai.OpenAI(
                base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=60
            )
        return self._client

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """A JSON request outside the client: the status and the parsed JSON answer."""
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.headers["content-type"] == "application/json"
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def sse(self, path: str, body: dict[str, Any]) -> list[str]:
        """A streamed request's raw SSE event payloads, in order (the last should be `[DONE]`)."""
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
            assert r.headers["content-type"] == "text/event-stream"
            raw = r.read().decode()
        assert raw.endswith("\n\n"), raw[-200:]
        events = raw.split("\n\n")[:-1]
        assert all(e.startswith("data: ") for e in events), events
        return [e.removeprefix("data: ") for e in events]

    def tokenize(self, **body: Any) -> dict[str, Any]:
        status, answer = self.post("/v1/tokenize", {"model": self.model, **body})
        assert status == 200, answer
        return answer

    def detokenize(self, tokens: list[int]) -> str:
        status, answer = self.post("/v1/detokenize", {"model": self.model, "tokens": tokens})
        assert status == 200, answer
        return answer["prompt"]


def conformance_model(target: Path) -> Path:
    """The default model's files under `target`, its chat template extended with `THINKING_SWITCH`."""
    source = default_model_dir()
    shutil.copytree(source, target, symlinks=False)
    template = target / "chat_template.jinja"
    template.write_text(template.read_text() + THINKING_SWITCH)
    return target


@contextlib.contextmanager
def gateway_in_front_of(engines: list[str], model_dir: Path, tmp: Path) -> Iterator[Gateway]:
    """extproc and a real Envoy in front of engines that already run (as `local_stack` starts them)."""
    ports = FreePorts()
    loop = LoopThread()
    settings = Settings(
        listen="127.0.0.1:0",
        model_dir=model_dir,
        engines=tuple(f"grpc://{address}" for address in engines),
        load_interval=0,
    )
    try:
        running = loop.run(server.start(settings, engine_wait_s=30), timeout=60)
    except BaseException:
        loop.close()
        raise
    port, admin_port = ports.one(), ports.one()
    config = tmp / "envoy.json"
    config.write_text(
        render_bootstrap(
            EnvoyOptions(
                listen_port=port,
                admin_port=admin_port,
                extproc_target=running.address,
                max_request_bytes=settings.max_body_bytes,
            )
        )
    )
    try:
        with envoy_running(config, admin_port):
            yield Gateway(f"http://127.0.0.1:{port}", running.model, "vllm", "vllm", model_dir)
    finally:
        loop.run(running.stop(grace=1))
        loop.close()


def parse_events(events: list[str]) -> list[dict[str, Any]]:
    """The JSON events before `[DONE]`, which must be the last and only there."""
    assert events and events[-1] == "[DONE]", events[-3:]
    assert "[DONE]" not in events[:-1]
    return [json.loads(e) for e in events[:-1]]
