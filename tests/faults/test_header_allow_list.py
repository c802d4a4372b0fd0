"""Issue 15, "every client header reaches the engine as gRPC metadata": `Authorization` and cookies leaked
to engines, a header block over ~16 KiB became a fake 429 from the engine's metadata limit, and a client's
`grpc-timeout` set the engine's deadline. Only the headers the engine needs reach it now
(contracts.ENGINE_REQUEST_HEADERS); an engine spy (the simulator's `record_calls`) sees what arrives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc import contracts
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

BIG_HEADER = "x-big-custom"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sim = SimOptions(record_calls=16)
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("headers")), engines=1, sim=sim) as s:
        yield s


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_credentials_deadlines_and_big_headers_do_not_reach_the_engine(stack: Stack, path: str) -> None:
    engine = stack.engines.engines[0]
    before = len(engine.core.recorded)
    body: dict[str, object] = {"model": stack.model, "max_tokens": 2}
    if path == "/v1/completions":
        body["prompt"] = "hello"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    headers = {
        "authorization": "Bearer sk-secret",
        "cookie": "session=s3cr3t",
        "grpc-timeout": "1m",  # one millisecond: a deadline the engine would have to honour
        BIG_HEADER: "v" * 20 * 1024,
        "x-request-id": "allow-list-1",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    conn = post_json(stack.base_url, path, body, headers=headers)
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 200, payload  # no fake 429 from the engine's metadata limit
    assert payload["usage"]["completion_tokens"] == 2

    (call,) = list(engine.core.recorded)[before:]
    names = {key for key, _ in call.metadata}
    for leaked in ("authorization", "cookie", "grpc-timeout", BIG_HEADER):
        assert leaked not in names, f"{leaked} reached the engine"
    assert call.deadline_s is None, "the client's grpc-timeout set the engine's deadline"
    # What the engine may see is the allow-list, and the trace ids on it do arrive.
    assert names <= set(contracts.ENGINE_REQUEST_HEADERS), names
    assert call.header("x-request-id") == "allow-list-1"
    assert call.header("traceparent") == headers["traceparent"]
