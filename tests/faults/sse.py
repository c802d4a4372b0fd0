"""Reading an SSE stream from a raw HTTP response, for the fault tests that hold connections open."""

from __future__ import annotations

import json
from http.client import HTTPResponse
from typing import Any


def read_events(response: HTTPResponse) -> list[dict[str, Any]]:
    """Every `data:` event of a finished stream as JSON, up to (not including) `[DONE]`, which must end it."""
    return parse_events(response.read().decode())


def parse_events(raw: str) -> list[dict[str, Any]]:
    """`read_events` of a stream's body already read."""
    events = [e.strip().removeprefix("data: ") for e in raw.split("\n\n") if e.strip()]
    assert events and events[-1] == "[DONE]", f"the stream did not end with [DONE]: {raw[-300:]!r}"
    return [json.loads(e) for e in events[:-1]]
