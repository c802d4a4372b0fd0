"""Issue 15: "an empty completions prompt reaches the engine (inside batches too)". It is a 400 naming
`prompt` now, and no engine sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("empty"))) as s:
        yield s


@pytest.mark.parametrize("prompt", ["", [""], ["a prompt", ""], ["", "a prompt"]])
def test_an_empty_prompt_is_a_400_before_any_engine(stack: Stack, prompt: object) -> None:
    before = stack.generate_requests()
    conn = post_json(
        stack.base_url, "/v1/completions", {"model": stack.model, "prompt": prompt, "max_tokens": 2}
    )
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 400, payload
    assert payload["error"]["param"] == "prompt"
    assert payload["error"]["type"] == "invalid_request_error"
    assert stack.generate_requests() == before


def test_a_nonempty_batch_still_works(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": ["a", "b"], "max_tokens": 1}
    conn = post_json(stack.base_url, "/v1/completions", body)
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 200, payload
    assert len(payload["choices"]) == 2
