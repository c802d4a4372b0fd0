"""Shared test helpers: free TCP ports on loopback, a native gateway serving the default model, the one
real vLLM engine of the session, and the session's guard against processes its tests leave running."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from extproc import _native
from extproc.models import default_model_dir, served_model_name
from tests import leftover_processes

if TYPE_CHECKING:
    from load.vllm_engine import VllmProcess

# The name the default model (the packaged Llama 3 tokenizer and template) is served under.
DEFAULT_MODEL = served_model_name(default_model_dir())


def default_gateway(name: str = DEFAULT_MODEL, **model: Any) -> _native.Gateway:
    """A native gateway (1 MiB bodies) serving the default model as `name`; `model`: `add_model`'s
    keywords (policy, routing_config)."""
    gateway = _native.Gateway(max_body_bytes=1 << 20)
    gateway.add_model(name, str(default_model_dir()), **model)
    return gateway


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class FreePorts:
    """Hands out loopback ports that are free now and distinct within one test."""

    def __init__(self) -> None:
        self.given: set[int] = set()

    def one(self) -> int:
        return self.block(1)

    def block(self, n: int) -> int:
        """The first of `n` consecutive free ports (for servers that take a port range)."""
        for _ in range(200):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                first = sock.getsockname()[1]
            span = range(first, first + n)
            if first + n <= 65536 and not self.given.intersection(span) and all(map(_bindable, span)):
                self.given.update(span)
                return first
        raise RuntimeError(f"no {n} consecutive free ports found")


@pytest.fixture
def free_ports() -> FreePorts:
    return FreePorts()


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    """The real vLLM CPU engine serving load.vllm_engine's tiny Llama, started by the first test that asks
    for it and stopped at the end of the session: it takes 30-100 s to come up, so the contract, conformance
    and ZMQ suites share this one. Its prefix cache is shared too: each test uses prompts of its own."""
    from load.vllm_engine import start_vllm

    with start_vllm(log_path=tmp_path_factory.mktemp("vllm") / "vllm.log") as engine:
        yield engine


@pytest.fixture(scope="session", autouse=True)
def no_process_left_running() -> Iterator[None]:
    """Tests stop what they start. Set up before every other fixture, so torn down after them all: any
    process the session started that is still alive then is reported as an error of the last test, and
    killed (it carries this session's mark, so it is ours) rather than left on the machine."""
    token = leftover_processes.mark_session()
    yield
    found = leftover_processes.leftovers(token)
    leftover_processes.kill(found)
    assert not found, "processes the tests started were still running (now killed):\n" + "\n".join(
        map(str, found)
    )
