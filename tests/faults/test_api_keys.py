"""Issue 15: "no authentication option at all; a raw gRPC client on the ext_proc port gets batched
completions answered without Envoy". With `api_keys_file` set, every request needs `Authorization: Bearer
<key>` of a listed key, checked in the native stream at the request headers, before any body or engine
work: through Envoy and on the raw ext_proc port alike. Issue 18: what the Responses API stores belongs to
the key that stored it; another key finds nothing of it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.api_keys import KeyEntry, key_digest
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

ALICE = "sk-alice-0123456789"  # the served model, no rate limit
BOB = "sk-bob-0123456789"  # another model only
CAROL = "sk-carol-0123456789"  # the served model, 2 requests a minute
DAVE = "sk-dave-0123456789"  # the served model, no rate limit: a second tenant beside alice


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("keys"))
    keys = tmp / "keys.jsonl"
    # Written before the model name is known: "*" stands for it (the served model is the only one).
    entries = [
        KeyEntry(key_digest(ALICE), "alice", ("*",), 0),
        KeyEntry(key_digest(BOB), "bob", ("some-other-model",), 0),
        KeyEntry(key_digest(CAROL), "carol", ("*",), 2),
        KeyEntry(key_digest(DAVE), "dave", ("*",), 0),
    ]
    keys.write_text("# test keys\n" + "".join(e.line() + "\n" for e in entries))
    with local_stack(FreePorts(), tmp, api_keys_file=keys) as s:
        yield s


def call(
    stack: Stack, key: str | None, path: str = "/v1/completions", body: Any = None
) -> tuple[int, Any, Any]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if body is None:
        body = {"model": stack.model, "prompt": ["one", "two"], "max_tokens": 1}
    conn = post_json(stack.base_url, path, body, headers=headers)
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    return response.status, payload, response


def get_models(stack: Stack, key: str) -> list[str]:
    import urllib.request

    request = urllib.request.Request(
        f"{stack.base_url}/v1/models", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return [m["id"] for m in json.load(r)["data"]]


@pytest.mark.parametrize("key", [None, "sk-unknown", ALICE + "x"])
def test_a_missing_or_unknown_key_is_401_and_reaches_no_engine(stack: Stack, key: str | None) -> None:
    before = stack.generate_requests()
    status, payload, _ = call(stack, key)
    assert status == 401, payload
    assert payload["error"]["code"] == "invalid_api_key"
    assert stack.generate_requests() == before


def test_a_listed_key_is_served_and_its_key_never_reaches_the_engine(stack: Stack) -> None:
    status, payload, _ = call(stack, ALICE)
    assert status == 200, payload
    assert len(payload["choices"]) == 2
    status, payload, _ = call(
        stack,
        ALICE,
        "/v1/chat/completions",
        {"model": stack.model, "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 200, payload
    assert get_models(stack, ALICE) == [stack.model]


def test_a_model_the_key_may_not_use_answers_as_unknown(stack: Stack) -> None:
    before = stack.generate_requests()
    status, payload, _ = call(stack, BOB)
    assert status == 404, payload
    assert payload["error"]["code"] == "model_not_found"
    assert payload["error"]["param"] == "model"
    assert stack.generate_requests() == before
    assert get_models(stack, BOB) == []


def test_a_key_over_its_rate_gets_429_with_retry_after(stack: Stack) -> None:
    statuses = []
    started = time.monotonic()
    for _ in range(3):
        status, payload, response = call(stack, CAROL)
        statuses.append(status)
    assert time.monotonic() - started < 25, "the test relies on the bucket not refilling (30 s a token)"
    assert statuses == [200, 200, 429], statuses
    assert payload["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(response.getheader("retry-after")) <= 30


def test_a_raw_grpc_client_on_the_ext_proc_port_is_refused_too(stack: Stack) -> None:
    """The port must not be reachable except by Envoy (loopback by default); with keys it refuses anyway."""
    before = stack.generate_requests()

    def header_map(**pairs: str) -> ep.HttpHeaders:
        values = [core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        return ep.HttpHeaders(headers=core.HeaderMap(headers=values))

    body = {"model": stack.model, "prompt": ["one", "two"], "max_tokens": 1}
    requests = [
        ep.ProcessingRequest(request_headers=header_map(**{":method": "POST", ":path": "/v1/completions"})),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)),
    ]
    with grpc.insecure_channel(stack.gateway.address) as channel:
        replies = ep_grpc.ExternalProcessorStub(channel).Process(iter(requests), timeout=10)
        first = next(replies)
        replies.cancel()
    assert first.WhichOneof("response") == "immediate_response"
    assert first.immediate_response.status.code == 401
    assert json.loads(first.immediate_response.body)["error"]["code"] == "invalid_api_key"
    assert stack.generate_requests() == before


def test_stored_responses_and_conversations_belong_to_the_key_that_stored_them(stack: Stack) -> None:
    """Another key gets the 404 of an id that does not exist, on every route, and changes nothing; the
    key that stored them finds all of it."""
    alice, dave = (
        openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=30)
        for key in (ALICE, DAVE)
    )
    first = alice.responses.create(model=stack.model, input="Name a color.", max_output_tokens=3)
    conv = alice.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember: blue."}]
    )
    (item,) = alice.conversations.items.list(conv.id).data
    note = [{"type": "message", "role": "user", "content": "Forget it."}]
    before = stack.generate_requests()
    foreign: dict[str, Any] = {
        "retrieve": lambda: dave.responses.retrieve(first.id),
        "input_items": lambda: dave.responses.input_items.list(first.id),
        "delete": lambda: dave.responses.delete(first.id),
        "chain": lambda: dave.responses.create(
            model=stack.model, input="More.", previous_response_id=first.id
        ),
        "conversation": lambda: dave.conversations.retrieve(conv.id),
        "update": lambda: dave.conversations.update(conv.id, metadata={"k": "v"}),
        "items": lambda: dave.conversations.items.list(conv.id),
        "add items": lambda: dave.conversations.items.create(conv.id, items=note),
        "item": lambda: dave.conversations.items.retrieve(item.id, conversation_id=conv.id),
        "delete item": lambda: dave.conversations.items.delete(item.id, conversation_id=conv.id),
        "delete conversation": lambda: dave.conversations.delete(conv.id),
        "respond in": lambda: dave.responses.create(model=stack.model, input="Which?", conversation=conv.id),
    }
    for name, attempt in foreign.items():
        with pytest.raises(openai.NotFoundError) as e:
            attempt()
        assert "not found" in e.value.body["message"], (name, e.value.body)
    assert stack.generate_requests() == before, "a foreign history reached no engine"
    # Exactly what an id that never existed answers: nothing tells that it exists.
    unknown_id = "resp_never" + first.id[len("resp_never") :]
    with pytest.raises(openai.NotFoundError) as foreign_error:
        dave.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as unknown_error:
        dave.responses.retrieve(unknown_id)
    assert json.dumps(foreign_error.value.body) == json.dumps(unknown_error.value.body).replace(
        unknown_id, first.id
    )

    assert alice.responses.retrieve(first.id).model_dump() == first.model_dump()
    assert [i.id for i in alice.conversations.items.list(conv.id).data] == [item.id], (
        "nothing added or deleted"
    )
    assert alice.conversations.retrieve(conv.id).metadata == {}
    second = alice.responses.create(
        model=stack.model, input="And another?", previous_response_id=first.id, max_output_tokens=2
    )
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, (
        "the history was read"
    )
    alice.responses.delete(first.id)
    alice.conversations.delete(conv.id)
