"""A busy request cannot starve the others (issue 15): while two 7 MB prompts are tokenized, a 7 MB prompt
over the context and a 4 MB stop string are refused, unrelated short requests keep their latency within a
bound of a baseline measured here, and no unrelated stream is cut."""

from __future__ import annotations

import http.client
import json
import re
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json

BIG_PROMPT_BYTES = 7_000_000
BIG_STOP_BYTES = 4_000_000
UNRELATED_STREAMS = 5
# 20 ms per token: an unrelated 150-token stream lasts about 3 s, across the heavy requests.
STREAM_TOKENS = 150


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("busy"))
    with local_stack(FreePorts(), tmp, sim=SimOptions(itl_ms=20.0), max_body_bytes=16 << 20) as s:
        yield s


def big_text(size: int, seed: int = 0) -> str:
    """Varied words (nothing a tokenizer cache could shortcut), `size` bytes or a little more."""
    words: list[str] = []
    total = 0
    i = 0
    while total < size:
        word = f"w{(i + seed) * 7919 % 1_000_003} "
        words.append(word)
        total += len(word)
        i += 1
    return "".join(words)


def post(stack: Stack, path: str, body: Any, timeout: float = 120.0) -> tuple[int, Any, float]:
    """Status, parsed body and seconds taken."""
    began = time.monotonic()
    conn = post_json(stack.base_url, path, body, timeout=timeout)
    try:
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    return response.status, json.loads(raw) if raw else None, time.monotonic() - began


def post_raw(stack: Stack, path: str, body: bytes) -> tuple[int, bytes, float]:
    """POST an encoded body: the test's own JSON work on megabytes would hold the GIL the short
    requests' thread needs, and count against the gateway."""
    began = time.monotonic()
    host, port = stack.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    return response.status, raw, time.monotonic() - began


def field(raw: bytes, pattern: str) -> str | None:
    """One field of a large JSON answer, without parsing all of it."""
    found = re.search(pattern.encode(), raw)
    return found.group(1).decode() if found else None


def small(stack: Stack) -> tuple[int, Any, float]:
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return post(stack, "/v1/chat/completions", body, timeout=60)


def stream_to_end(stack: Stack, outcomes: list[str]) -> None:
    """One unrelated streamed chat, read to its end; records its finish reason or what cut it."""
    body = {"model": stack.model, "messages": [{"role": "user", "content": "tell"}], "stream": True}
    body |= {"max_tokens": STREAM_TOKENS, "ignore_eos": True}
    try:
        conn = post_json(stack.base_url, "/v1/chat/completions", body, timeout=60)
        response = conn.getresponse()
        raw = response.read().decode()
        conn.close()
        events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
        if response.status != 200 or events[-1:] != ["[DONE]"]:
            outcomes.append(f"cut: HTTP {response.status}, {raw[-200:]!r}")
            return
        finish = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])]
        outcomes.append(str(finish[-1]) if finish else "no finish reason")
    except Exception as e:  # a reset connection: the stream was cut
        outcomes.append(f"cut: {e!r}")


def test_a_busy_request_does_not_starve_the_others(stack: Stack) -> None:
    for _ in range(3):  # warm up
        assert small(stack)[0] == 200
    baseline = [small(stack)[2] for _ in range(15)]
    base_p50, base_max = statistics.median(baseline), max(baseline)

    heavy: dict[str, tuple[int, bytes, float]] = {}
    prompt = big_text(BIG_PROMPT_BYTES)
    bodies = {
        # Legitimate and heavy: tokenized in full, wherever that runs.
        "tokenize": ("/v1/tokenize", {"model": stack.model, "prompt": prompt}),
        "tokenize again": ("/v1/tokenize", {"model": stack.model, "prompt": big_text(BIG_PROMPT_BYTES, 1)}),
        # Over the context: refused, ideally before tokenizing.
        "prompt": ("/v1/completions", {"model": stack.model, "prompt": prompt, "max_tokens": 1}),
        "stop": (
            "/v1/chat/completions",
            {
                "model": stack.model,
                "messages": [{"role": "user", "content": "x"}],
                "stop": "s" * BIG_STOP_BYTES,
            },
        ),
    }

    heavy_bodies = {name: (path, json.dumps(body).encode()) for name, (path, body) in bodies.items()}
    del bodies, prompt

    def run_heavy(name: str) -> None:
        path, body = heavy_bodies[name]
        heavy[name] = post_raw(stack, path, body)

    streams: list[str] = []
    stream_threads = [
        threading.Thread(target=stream_to_end, args=(stack, streams)) for _ in range(UNRELATED_STREAMS)
    ]
    heavy_threads = [threading.Thread(target=run_heavy, args=(name,)) for name in heavy_bodies]
    for t in stream_threads:
        t.start()
    time.sleep(0.3)  # the streams are flowing
    began = time.monotonic()
    for t in heavy_threads:
        t.start()
    during: list[tuple[int, float]] = []
    # Short requests while the heavy ones are processed (and for at least 2 s).
    while any(t.is_alive() for t in heavy_threads) or time.monotonic() - began < 2.0:
        status, _, took = small(stack)
        during.append((status, took))
    for t in heavy_threads + stream_threads:
        t.join(timeout=120)

    latencies = [took for _, took in during]
    p50, worst = statistics.median(latencies), max(latencies)
    print(
        f"\nbaseline p50 {base_p50 * 1000:.0f} ms max {base_max * 1000:.0f} ms; during heavy requests "
        f"({len(during)} requests) p50 {p50 * 1000:.0f} ms max {worst * 1000:.0f} ms; heavy: "
        + ", ".join(f"{k} HTTP {v[0]} in {v[2]:.2f} s" for k, v in heavy.items())
        + f"; streams: {streams}"
    )
    assert [s for s, _ in during if s != 200] == [], "unrelated short requests failed"
    assert streams == ["length"] * UNRELATED_STREAMS, "an unrelated stream was cut"
    for name in ("tokenize", "tokenize again"):
        assert heavy[name][0] == 200 and int(field(heavy[name][1], r'"count":\s*(\d+)') or 0) > 1_000_000
    assert heavy["prompt"][0] == 400 and json.loads(heavy["prompt"][1])["error"]["param"] == "prompt"
    assert heavy["stop"][0] == 400 and json.loads(heavy["stop"][1])["error"]["param"] == "stop"
    # Generous on a shared 2-core machine: the heavy work shares the CPUs, it must not queue the others.
    assert p50 <= 4 * base_p50 + 0.2, f"p50 {p50:.3f} s against a baseline of {base_p50:.3f} s"
    assert worst <= 5 * base_max + 1.5, f"max {worst:.3f} s against a baseline max of {base_max:.3f} s"
