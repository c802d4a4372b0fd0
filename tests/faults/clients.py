"""Concurrent clients for the fault suite: each request's status, the SSE error it ended with (if any)
and how long it took, as a client sees them."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.integration.harness import Stack, post_json


@dataclass(frozen=True)
class Outcome:
    status: int
    # The error a streamed 200 ended with (its SSE error event), else None.
    stream_error: dict[str, Any] | None
    body: str
    seconds: float
    started: float  # time.monotonic() when it was sent

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.stream_error is None

    @property
    def label(self) -> str:
        if self.stream_error is not None:
            return f"200+error {self.stream_error.get('code')}"
        return str(self.status)


def chat(
    stack: Stack, *, stream: bool, text: str = "hello", max_tokens: int = 8, timeout: float = 60
) -> Outcome:
    """One chat completion through Envoy, read to its end."""
    return chat_at(
        stack.base_url, stack.model, stream=stream, text=text, max_tokens=max_tokens, timeout=timeout
    )


def chat_at(
    base_url: str,
    model: str,
    *,
    stream: bool,
    text: str = "hello",
    max_tokens: int = 8,
    timeout: float = 60,
    usage: bool = False,
) -> Outcome:
    """One chat completion to the gateway at `base_url`, read to its end; `usage`: a streamed answer
    ends with its token counts."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    body |= {"max_tokens": max_tokens} | ({"stream_options": {"include_usage": True}} if usage else {})
    started = time.monotonic()
    conn = post_json(base_url, "/v1/chat/completions", body, timeout=timeout)
    try:
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        conn.close()
    error = None
    if stream and response.status == 200:
        events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e.strip()]
        for event in events:
            if event != "[DONE]" and "error" in (parsed := json.loads(event)):
                error = parsed["error"]
    return Outcome(response.status, error, raw, time.monotonic() - started, started)


def concurrently(n: int, call: Callable[[int], Outcome]) -> list[Outcome]:
    """`call(i)` for i in 0..n, all at once."""
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(call, range(n)))


def tally(outcomes: Sequence[Outcome]) -> Counter[str]:
    return Counter(o.label for o in outcomes)
