"""The anchor gateway (SMG, PyPI `smg`) serves chat through the simulator, on both engine protocols.

SMG checks the engine's HealthCheck, GetModelInfo and GetServerInfo before it routes, then drives
Generate: a client it does not share code with, so it catches protocol slips the project's own gateway
would share with the simulator.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from load.bench.gateways import DEFAULT_SMG_VENV, ensure_smg, start_smg


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def smg_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_smg(DEFAULT_SMG_VENV, tmp_path_factory.mktemp("smg-install"))


@pytest.fixture(params=["vllm", "sglang"])
def engines(request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    loop = _Loop()
    options = SimOptions(ttft_ms=2, itl_ms=1)
    cluster = loop.run(
        start_engines(default_model_dir(), count=2, base_port=0, options=options, protocol=request.param)
    )
    try:
        yield cluster
    finally:
        loop.run(cluster.stop(grace=None))
        loop.close()


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return json.loads(response.read())


def test_smg_serves_chat_through_the_simulator(smg_binary: Path, engines: SimCluster, tmp_path: Path) -> None:
    model_dir = default_model_dir()
    gateway = start_smg(smg_binary, engines.addresses, model_dir, model_dir.name, tmp_path)
    try:
        answer = post(
            f"{gateway.base_url}/v1/chat/completions",
            {
                "model": model_dir.name,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 12,
                "ignore_eos": True,
            },
        )
    finally:
        gateway.stop()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["message"]["content"].split()) >= 6  # words from the real vocabulary
    assert answer["usage"]["completion_tokens"] == 12 and answer["usage"]["prompt_tokens"] > 5
    assert sum(e.stats.completed for e in engines.engines) >= 1
