"""The engines the contract suite runs against: the simulator and a real vLLM (CPU) engine.

Both serve the same tiny random-weight Llama folder (built once and cached by `load.vllm_engine`), and
the simulator is configured as vLLM's CPU backend runs (128-token blocks, 128 sequences, a 1M-token
cache), so the suite asserts one behaviour for both. Each engine starts once per session (the real one is
the session's `real_vllm`, shared with other suites). Tests make their prompts unique (`Prompts`) because
the engines keep their caches for the whole session.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from extproc.simulator import SimCluster, SimOptions, start_engines
from load.vllm_engine import VllmProcess
from load.vllm_engine.tiny_model import MAX_MODEL_LEN, ensure_tiny_model

# vLLM's CPU backend: 128-token blocks, 128 running sequences; VLLM_CPU_KVCACHE_SPACE=1 GiB holds 1M
# tokens of the tiny model (8192 blocks).
SIM_OPTIONS = SimOptions(block_size=128, max_num_seqs=128, num_blocks=8192, max_model_len=MAX_MODEL_LEN)


@dataclass(frozen=True)
class Engine:
    kind: str  # "sim" or "vllm"
    address: str
    model_dir: Path


class _Loop:
    """The simulator's event loop on a thread of its own, so tests keep their own loops."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def sim_engine(tiny_model: Path) -> Iterator[Engine]:
    loop = _Loop()
    cluster: SimCluster = loop.run(start_engines(tiny_model, count=1, base_port=0, options=SIM_OPTIONS))
    try:
        yield Engine("sim", cluster.addresses[0], tiny_model)
    finally:
        loop.run(cluster.stop(grace=None))
        loop.close()


@pytest.fixture(scope="session")
def vllm_engine(real_vllm: VllmProcess) -> Engine:
    return Engine("vllm", real_vllm.address, real_vllm.model_dir)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_engine: runs against a real vLLM engine (built on first use)")


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.real_engine)])
def engine(request: pytest.FixtureRequest) -> Engine:
    return request.getfixturevalue(f"{request.param}_engine")


class Prompts:
    """Token-id prompts no other test used: plain word tokens, shifted per call."""

    _counter = itertools.count()

    def fresh(self, length: int) -> list[int]:
        start = 1000 + next(self._counter) * 7919 % 90000
        return [128000, *range(start, start + length - 1)]


@pytest.fixture
def prompts() -> Prompts:
    return Prompts()
