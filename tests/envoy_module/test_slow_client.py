"""A client that reads slowly, with the Envoy module answering: it pauses before reading anything, then reads
in small pieces with pauses, while the engine streams a long answer fast. The stream completes with every
token, in the same bytes as a client of the ext_proc path that reads the same way, and Envoy holds what
the client has not read once, not a copy per event or per filter (docs/operating.md, "The response path":
the engine connection's HTTP/2 window lets the engine finish, so the unread answer waits in Envoy)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.envoy_module.test_response_paths import _neutral
from tests.integration.harness import Stack, local_stack

TOKENS = 1500
# Envoy's per-connection buffer limit for these stacks (max_body_bytes): well under the answer's size.
BUFFER_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    ports = FreePorts()
    fast = SimOptions(ttft_ms=1, itl_ms=0.5)
    common = {"engines": 1, "sim": fast, "max_body_bytes": BUFFER_LIMIT}
    with local_stack(ports, Path(tmp_path_factory.mktemp("ext_proc")), **common) as reference:  # type: ignore[arg-type]
        with local_stack(
            ports,
            Path(tmp_path_factory.mktemp("module")),
            response_path="module",
            **common,  # type: ignore[arg-type]
        ) as module:
            yield {"ext_proc": reference, "module": module}


def _envoy_allocated(stack: Stack) -> int:
    with urllib.request.urlopen(stack.admin_url + "/memory", timeout=5) as r:
        return int(json.load(r)["allocated"])


def _read_slowly(stack: Stack, paused: list[int]) -> bytes:
    """The answer, read slowly; `paused` gets Envoy's allocated bytes at the end of the first pause."""
    url = urlparse(stack.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "a long story"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "seed": 3,
    }
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        time.sleep(2.0)  # reads nothing while the engine streams on
        paused.append(_envoy_allocated(stack))
        pieces = []
        while piece := response.read(2048):
            pieces.append(piece)
            if len(pieces) % 8 == 0:
                time.sleep(0.01)
        return b"".join(pieces)
    finally:
        conn.close()


def test_a_slow_client_gets_the_whole_stream_in_the_same_bytes(stacks: dict[str, Stack]) -> None:
    before = _envoy_allocated(stacks["module"])
    paused: list[int] = []
    got = _read_slowly(stacks["module"], paused)
    grown = paused[0] - before
    events = [e for e in got.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]"
    usage = json.loads(events[-2].removeprefix(b"data: "))["usage"]
    assert usage["completion_tokens"] == TOKENS
    assert len(got) > 4 * BUFFER_LIMIT, "the answer is larger than Envoy's buffer"
    # What the client had not read yet: held once (measured: ~0.95 of the answer), not copied.
    assert grown < 2 * len(got), (grown, len(got))
    print(f"Envoy grew {grown} bytes during the pause; the answer is {len(got)} bytes")
    assert _neutral(got) == _neutral(_read_slowly(stacks["ext_proc"], []))
