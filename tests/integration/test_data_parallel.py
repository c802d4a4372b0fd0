"""Data-parallel ranks through the real stack: one simulated engine with two DP ranks (one address, a
scheduler and KV cache per rank) is two router endpoints, `address#0` and `address#1`. Its KV events reach
the router rank by rank and each request is pinned to the rank the router picked (`data_parallel_rank`), so
a long prompt's repeats land on the rank that cached it, and two long prompts live on different ranks."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

# ~600 tokens each, different from their first block on: nothing of one is cached by the other's rank.
ALPHA = "Alpha manual. " + " ".join(f"Alpha rule {i}: keep the valve {i} closed." for i in range(60))
BRAVO = "Bravo ledger. " + " ".join(f"Bravo entry {i}: ship crate {i} north." for i in range(60))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A slow decode keeps the streamed request below running while the next one is routed.
    sim = SimOptions(data_parallel_size=2, itl_ms=20)
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("dp")), engines=1, sim=sim) as s:
        yield s


def prompt_tokens(stack: Stack) -> list[int]:
    """Prompt tokens each rank of the engine has scheduled so far."""
    return [s.stats.prompt_tokens for s in stack.engines.engines[0].core.schedulers]


def complete(stack: Stack, prompt: str) -> tuple[int, int]:
    """One completion; the rank that ran it and the cached prompt tokens the client was told."""
    before = prompt_tokens(stack)
    conn = post_json(
        stack.base_url, "/v1/completions", {"model": stack.model, "prompt": prompt, "max_tokens": 4}
    )
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200, body
    grew = [r for r, (a, b) in enumerate(zip(prompt_tokens(stack), before, strict=True)) if a > b]
    assert len(grew) == 1, grew
    return grew[0], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_long_prompts_stay_on_the_rank_that_caches_them(stack: Stack) -> None:
    address = stack.engines.addresses[0]
    gateway = stack.gateway.gateway
    assert wait_for(lambda: sorted(gateway.endpoints(stack.model)) == [f"{address}#0", f"{address}#1"])

    # Alpha runs (streamed, long) on one rank while Bravo is routed: Bravo goes to the idle rank.
    before = prompt_tokens(stack)
    body = {"model": stack.model, "prompt": ALPHA, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    running = post_json(stack.base_url, "/v1/completions", body, timeout=30)
    assert wait_for(lambda: prompt_tokens(stack) != before)
    alpha = next(r for r, (a, b) in enumerate(zip(prompt_tokens(stack), before, strict=True)) if a > b)
    bravo, cached = complete(stack, BRAVO)
    assert bravo != alpha, "the second long prompt went to the rank already busy with the first"
    assert cached == 0
    running.close()  # the client goes away: the gateway aborts Alpha on its rank
    time.sleep(0.5)  # Bravo's Stored events reach the router on the engine's KV-event stream

    # Each rank's KV events reach its own endpoint: repeats follow their prefix, served from that cache.
    # The engine itself would send an unpinned request to its least busy rank, the lowest when idle: a
    # repeat landing on rank 1 of an idle engine is the gateway's pin at work.
    for i in range(3):
        for text, holder in ((ALPHA, alpha), (BRAVO, bravo)):
            wait_for(lambda: sum(len(s.running) for s in stack.engines.engines[0].core.schedulers) == 0)
            rank, cached = complete(stack, f"{text} Question {i}?")
            assert rank == holder, f"repeat {i} of {text[:5]} ran on rank {rank}, not on {holder}"
            assert cached >= 500, cached
