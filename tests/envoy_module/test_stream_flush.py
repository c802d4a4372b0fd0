"""Held stream bytes on the module path (`stream_flush_ms`): the answer is the same bytes as the ext_proc
path's, the first content is not held, and held tokens reach the client on the flush timer when the
engine goes quiet (they do not wait for its next message)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.envoy_module.test_response_paths import _neutral
from tests.integration.harness import Stack, local_stack

# An engine step far longer than the flush window: a held token is due long before the next one comes.
STEP_MS = 300.0
FLUSH_MS = 60
TOKENS = 8


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    ports = FreePorts()
    sim = SimOptions(ttft_ms=1, itl_ms=STEP_MS)
    with local_stack(ports, Path(tmp_path_factory.mktemp("ext_proc")), engines=1, sim=sim) as reference:
        held = {"stream_flush_ms": FLUSH_MS}
        with local_stack(
            ports,
            Path(tmp_path_factory.mktemp("held")),
            engines=1,
            sim=sim,
            response_path="module",
            extproc_settings=held,
        ) as module:
            yield {"ext_proc": reference, "held": module}


def _stream(stack: Stack) -> list[tuple[float, bytes]]:
    """The streamed answer's body bytes as the client's socket received them, each with its arrival time
    (seconds after the request was sent)."""
    url = urlparse(stack.base_url)
    body = json.dumps(
        {
            "model": stack.model,
            "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": TOKENS,
            "ignore_eos": True,
            "seed": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {url.hostname}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    reads: list[tuple[float, bytes]] = []
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sent = time.monotonic()
        sock.sendall(head + body)
        while data := sock.recv(65536):
            reads.append((time.monotonic() - sent, data))
    return reads


def _dechunk(raw: bytes) -> bytes:
    """An HTTP/1.1 chunked response's body."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2 :]
    return body


def _content_events(data: bytes) -> int:
    return data.count(b'"delta":{"content"')


def test_held_stream_is_the_same_bytes_and_no_token_waits_for_the_next(stacks: dict[str, Stack]) -> None:
    reference = _dechunk(b"".join(d for _, d in _stream(stacks["ext_proc"])))
    reads = _stream(stacks["held"])
    held = _dechunk(b"".join(d for _, d in reads))
    assert _neutral(held) == _neutral(reference)
    assert held.endswith(b"data: [DONE]\n\n") and _content_events(held) == TOKENS

    # Reads closer together than half an engine step are one delivery.
    deliveries: list[list[bytes]] = []
    last = -1.0
    for at, data in reads:
        if at - last > STEP_MS / 2000:
            deliveries.append([])
        deliveries[-1].append(data)
        last = at
    per_delivery = [_content_events(b"".join(d)) for d in deliveries]
    # The timer sends each held token a flush window after it came, long before the engine's next step:
    # no delivery carries two tokens (without the timer each held token would go out with the next one).
    assert max(per_delivery) == 1, per_delivery
    assert sum(per_delivery) == TOKENS
