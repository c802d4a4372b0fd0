"""Both response paths answer the same bytes: the same requests (seeded, so the simulated engines say the
same tokens) through a stack whose responses extproc translates (`response_path = "ext_proc"`) and one
whose responses the extproc_envoy module translates inside Envoy (`"module"`), compared byte for byte
once the per-request `id` and `created` are set aside."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack

PATHS = ("ext_proc", "module")


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    ports = FreePorts()
    module_tmp = Path(tmp_path_factory.mktemp("module"))
    with local_stack(ports, Path(tmp_path_factory.mktemp("ext_proc")), engines=1) as reference:
        with local_stack(ports, module_tmp, engines=1, response_path="module") as module:
            # The module stack's ext_proc gets no response bodies: only the module can answer.
            filters = json.loads((module_tmp / "envoy.json").read_text())["static_resources"]["listeners"][0]
            hcm = filters["filter_chains"][0]["filters"][0]["typed_config"]
            ext_proc, response = hcm["http_filters"][:2]
            assert ext_proc["typed_config"]["processing_mode"]["response_body_mode"] == "NONE"
            assert response["typed_config"]["filter_name"] == "response"
            yield {"ext_proc": reference, "module": module}


def _post(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    url = urlparse(stack.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


_ID = re.compile(rb'"id":"(chatcmpl|cmpl)-[^"]*"')
_CREATED = re.compile(rb'"created":\d+')


def _neutral(body: bytes) -> bytes:
    """The body with its per-request id and creation time blanked."""
    return _CREATED.sub(b'"created":0', _ID.sub(rb'"id":"\1-x"', body))


def _by_choice(body: bytes) -> dict[object, list[bytes]]:
    """A stream's events (id and created blanked) grouped by the choice they carry, in order; events
    without a choice (usage, [DONE]) under None."""
    events: dict[object, list[bytes]] = {}
    for event in _neutral(body).split(b"\n\n"):
        if not event:
            continue
        data = event.removeprefix(b"data: ")
        choices = json.loads(data).get("choices") if data.startswith(b"{") else None
        events.setdefault(choices[0]["index"] if choices else None, []).append(event)
    return events


REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}),
    "chat_n2_logprobs": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "n": 2, "logprobs": True, "top_logprobs": 2},
    ),
    "completion_stop": ("/v1/completions", {"prompt": "Once upon a time", "stop": ["e"]}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_both_paths_answer_the_same_bytes(stacks: dict[str, Stack], name: str, stream: bool) -> None:
    path, body = REQUESTS[name]
    body = {**body, "model": stacks["ext_proc"].model, "max_tokens": 24, "seed": 7, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    answers = {p: _post(stacks[p], path, body) for p in PATHS}
    (ref_status, ref_headers, ref_body), (status, headers, got) = answers["ext_proc"], answers["module"]
    assert (
        (status, headers["content-type"])
        == (ref_status, ref_headers["content-type"])
        == (
            200,
            "text/event-stream" if stream else "application/json",
        )
    )
    if stream:
        # n > 1 interleaves the choices' events in the order the engine's messages arrive, which timing
        # decides on either path: each choice's own events must be the same bytes, in the same order.
        assert _by_choice(got) == _by_choice(ref_body)
    else:
        assert _neutral(got) == _neutral(ref_body)
    assert b"[DONE]" in got if stream else json.loads(got)["usage"]["completion_tokens"] > 0
