"""Bad input gets an OpenAI-style error from the gateway, and the engines never see it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.integration.harness import Stack

OK_MESSAGES = [{"role": "user", "content": "hi"}]


def call(stack: Stack, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(
        f"{stack.base_url}{path}", data=body, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.load(e)


def chat(**fields: object) -> bytes:
    return json.dumps(fields).encode()


CASES = [
    ("malformed JSON", b'{"model": ', 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("missing messages", chat(model="MODEL"), 400, "messages"),
    ("missing model", chat(messages=OK_MESSAGES), 400, "model"),
    ("empty messages", chat(model="MODEL", messages=[]), 400, "messages"),
    ("unknown model", chat(model="no-such-model", messages=OK_MESSAGES), 404, "model"),
    ("wrong type", chat(model="MODEL", messages=OK_MESSAGES, temperature="hot"), 400, "temperature"),
    ("out of range", chat(model="MODEL", messages=OK_MESSAGES, top_p=1.5), 400, "top_p"),
    ("bad max_tokens", chat(model="MODEL", messages=OK_MESSAGES, max_tokens=-1), 400, "max_tokens"),
    ("bad role", chat(model="MODEL", messages=[{"role": "wizard", "content": "x"}]), 400, "messages"),
    (
        "over the context",
        chat(model="MODEL", messages=[{"role": "user", "content": "word " * 9000}]),
        400,
        "messages",
    ),
    (
        "completion over the context",
        chat(model="MODEL", messages=OK_MESSAGES, max_tokens=8190),
        400,
        "messages",
    ),
    ("empty body", b"", 400, None),
    (
        "min over max",
        chat(model="MODEL", messages=OK_MESSAGES, max_tokens=2, min_tokens=5),
        400,
        "min_tokens",
    ),
    ("bad logit_bias", chat(model="MODEL", messages=OK_MESSAGES, logit_bias={"x": 1}), 400, "logit_bias"),
    ("bad stop", chat(model="MODEL", messages=OK_MESSAGES, stop=[1]), 400, "stop"),
]


@pytest.mark.parametrize(("body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_chat_request_is_refused_by_the_gateway(
    stack: Stack, body: bytes, status: int, param: str | None
) -> None:
    body = body.replace(b"MODEL", stack.model.encode())
    before = stack.generate_requests()
    got, headers, payload = call(stack, "POST", "/v1/chat/completions", body)
    assert got == status, payload
    assert headers["content-type"] == "application/json"
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    assert error["code"] == status
    assert stack.generate_requests() == before


def test_oversize_body_is_413(stack: Stack) -> None:
    before = stack.generate_requests()
    huge = chat(model=stack.model, messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}])
    status, _, payload = call(stack, "POST", "/v1/chat/completions", huge)
    assert status == 413
    assert payload["error"]["type"] == "invalid_request_error"
    assert stack.generate_requests() == before


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/nothing", 404),
        ("POST", "/", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
    ],
)
def test_unknown_routes_and_methods(stack: Stack, method: str, path: str, status: int) -> None:
    got, _, payload = call(stack, method, path)
    assert got == status
    assert payload["error"]["code"] == status
