"""Batched completions (a list `prompt`): the native server calls the engines itself, so Envoy's retries
and timeouts do not apply; each prompt's call gets the request's fallbacks and the same deadline a
non-streamed request gets (`first_token_timeout + inter_token_timeout * max_tokens`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

FIRST_TOKEN_S = 1.0
INTER_TOKEN_S = 0.5
MAX_TOKENS = 4
MARGIN_S = 3.0
PROMPTS = [f"prompt number {i}" for i in range(6)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    settings = {"first_token_timeout": FIRST_TOKEN_S, "inter_token_timeout": INTER_TOKEN_S}
    with local_stack(
        FreePorts(), tmp_path, engines=2, routing_policy="round_robin", extproc_settings=settings
    ) as s:
        yield s


def batch(stack: Stack) -> tuple[int, dict, float]:
    body = {"model": stack.model, "prompt": PROMPTS, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    started = time.monotonic()
    conn = post_json(stack.base_url, "/v1/completions", body, timeout=30)
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    return response.status, payload, time.monotonic() - started


def test_a_refusing_engine_s_prompts_go_to_the_fallback(stack: Stack) -> None:
    refusing, healthy = stack.engines.engines
    refusing.faults.set(fail_code="UNAVAILABLE", fail_message="engine core is down")
    status, payload, _ = batch(stack)
    assert status == 200, payload
    assert [c["index"] for c in payload["choices"]] == list(range(len(PROMPTS)))
    assert refusing.stats.faults >= 1, "round robin sent some prompts to the refusing engine first"
    assert healthy.stats.completed == len(PROMPTS)
    # Reported to the router: the next batch goes to the healthy engine alone.
    faults = refusing.stats.faults
    status, _, _ = batch(stack)
    assert status == 200 and refusing.stats.faults == faults


def test_a_stalled_engine_s_prompts_end_the_batch_with_504_and_are_aborted(stack: Stack) -> None:
    stalled, _healthy = stack.engines.engines
    stalled.faults.set(stall=True)
    status, payload, seconds = batch(stack)
    assert status == 504, payload
    assert payload["error"]["type"] == "timeout"
    assert seconds < FIRST_TOKEN_S + INTER_TOKEN_S * MAX_TOKENS + MARGIN_S
    assert wait_for(lambda: stalled.stats.abort_calls >= 1), "the stalled calls were aborted"
    assert wait_for(lambda: stalled.stats.active == 0), "the stalled engine still holds them"
    status, payload, _ = batch(stack)
    assert status == 200, "the stalled engine is avoided: every prompt goes to the other"
