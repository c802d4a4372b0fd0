"""Cheap refusals before expensive work (issue 15): each per-request amplifier over its cap is answered
with a 400 naming the field and the limit, and nothing reaches an engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.config import Settings
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

# The caps (native/core/src/openai/request.rs, extproc/settings.py).
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_BYTES = 1024
MAX_STOP_TOKEN_IDS = 1024
BUDGET = Settings().max_buffered_output_tokens


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("amplifiers"))) as s:
        yield s


def post(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    conn = post_json(stack.base_url, path, body, timeout=60)
    try:
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def chat(stack: Stack, **fields: Any) -> dict[str, Any]:
    return {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], **fields}


CASES: dict[str, tuple[str, Any, str, str]] = {
    # name: (path, body fields, param, text the message must hold)
    "too many stop strings": (
        "/v1/chat/completions",
        {"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]},
        "stop",
        f"at most {MAX_STOP_STRINGS} stop strings",
    ),
    "a 4 MB stop string": (
        "/v1/chat/completions",
        {"stop": "s" * 4_000_000},
        "stop",
        f"{MAX_STOP_STRING_BYTES} bytes",
    ),
    "too many stop token ids": (
        "/v1/chat/completions",
        {"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))},
        "stop_token_ids",
        f"at most {MAX_STOP_TOKEN_IDS}",
    ),
    "n 64 x 1,000 tokens x top_logprobs 20, not streamed": (
        "/v1/chat/completions",
        {"n": 64, "max_tokens": 1000, "logprobs": True, "top_logprobs": 20},
        "max_tokens",
        f"limit of {BUDGET} tokens",
    ),
    "a batch of 8 prompts x n 8 x 5,000 tokens": (
        "/v1/completions",
        {"prompt": ["a"] * 8, "n": 8, "max_tokens": 5_000},
        "max_tokens",
        f"limit of {BUDGET} tokens",
    ),
    "n over 128": ("/v1/chat/completions", {"n": 129}, "n", "128"),
    "top_logprobs over 20": (
        "/v1/chat/completions",
        {"logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "20",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_an_amplifier_over_its_cap_is_refused_before_any_engine_call(stack: Stack, case: str) -> None:
    path, fields, param, text = CASES[case]
    calls = stack.generate_requests()
    body = chat(stack, **fields) if path == "/v1/chat/completions" else {"model": stack.model, **fields}
    status, answer = post(stack, path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert text in answer["error"]["message"]
    assert stack.generate_requests() == calls


PROMPT_FIELDS = [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")]


@pytest.mark.parametrize(("path", "param"), PROMPT_FIELDS)
def test_a_prompt_whose_bytes_alone_exceed_the_context_is_refused_before_tokenizing(
    stack: Stack, path: str, param: str
) -> None:
    text = "word " * 1_400_000  # 7 MB: more bytes than 8,192 tokens of any vocabulary piece can hold
    body: dict[str, Any] = {"model": stack.model, "max_tokens": 1}
    body |= {"prompt": text} if param == "prompt" else {"messages": [{"role": "user", "content": text}]}
    calls = stack.generate_requests()
    status, answer = post(stack, path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    message = answer["error"]["message"]
    assert "maximum context length is 8192 tokens" in message and "bytes" in message, message
    assert stack.generate_requests() == calls


def test_requests_within_the_caps_are_served(stack: Stack) -> None:
    calls = stack.generate_requests()
    fields = {"stop": [f"never{i}" for i in range(MAX_STOP_STRINGS)], "stop_token_ids": [1, 2, 3]}
    fields |= {"n": 4, "max_tokens": 8, "logprobs": True, "top_logprobs": 20, "temperature": 1.0}
    status, answer = post(stack, "/v1/chat/completions", chat(stack, **fields))
    assert status == 200, answer
    assert len(answer["choices"]) == 4
    assert len(answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    # Streamed, the same amplification is not buffered: it is not held to the budget.
    fields = {"n": 64, "max_tokens": 1000, "logprobs": True, "top_logprobs": 20, "stream": True}
    status_line = post_json(stack.base_url, "/v1/chat/completions", chat(stack, **fields), timeout=60)
    response = status_line.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "
    status_line.close()
    assert stack.generate_requests() == calls + 2
