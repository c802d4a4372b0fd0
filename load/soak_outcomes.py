"""The soak's bookkeeping: what one request ended as, seen from the client, and the tally of a run.

Every request sent ends as exactly one of:

- `completed`: a 200 with the whole answer (a JSON body with choices; a stream that ended with `[DONE]`
  and carried no error event);
- `errored`: the client saw an error: an HTTP error status, an SSE error event, a refused connection, or
  a connection cut while the answer was being read (each counted by its kind);
- `disconnected`: the client hung up on purpose mid-stream (the soak's own disconnects);
- `lost`: neither an answer nor an error: no answer within the client's timeout, a 200 whose body holds
  no answer, or a stream that ended cleanly without `[DONE]` and without an error event. Must be 0.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

COMPLETED = "completed"
ERRORED = "errored"
DISCONNECTED = "disconnected"
LOST = "lost"
KINDS = (COMPLETED, ERRORED, DISCONNECTED, LOST)
SAMPLE_CHARS = 300


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of KINDS
    detail: str = ""  # the error's kind for errored and lost: "http 503", "sse 504", "timeout", ...
    sample: str = ""  # the start of what the client got, to tell what the error said


def judge_body(status: int, body: bytes, streamed: bool) -> Outcome:
    """A response read to its end (the connection ended it cleanly)."""
    text = body.decode(errors="replace")
    if status != 200:
        return Outcome(ERRORED, f"http {status}", text[:SAMPLE_CHARS])
    if not streamed:
        try:
            answer = json.loads(text)
        except ValueError:
            return Outcome(LOST, "200 without a JSON answer")
        if "error" in answer:
            return Outcome(ERRORED, f"200 with error {answer['error'].get('code')}")
        if not answer.get("choices"):
            return Outcome(LOST, "200 without choices")
        return Outcome(COMPLETED)
    events = [e.strip().removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
    for event in events:
        if event == "[DONE]":
            continue
        try:
            parsed = json.loads(event)
        except ValueError:
            return Outcome(LOST, "stream with an unreadable event")
        if isinstance(parsed, dict) and "error" in parsed:
            return Outcome(ERRORED, f"sse {parsed['error'].get('code')}", event[:SAMPLE_CHARS])
    if not events or events[-1] != "[DONE]":
        return Outcome(LOST, "stream ended without [DONE] or an error event")
    return Outcome(COMPLETED)


def judge_cut(status: int | None, error: BaseException) -> Outcome:
    """The request failed with `error` before (status None) or while reading the response."""
    if isinstance(error, TimeoutError):
        # No answer and no error within the client's timeout: the failure the soak exists to catch.
        return Outcome(LOST, "timeout" if status is None else "timeout mid-answer")
    name = type(error).__name__
    if status is None:
        return Outcome(ERRORED, f"connection {name}")
    return Outcome(ERRORED, f"cut after {status}: {name}")


@dataclass
class Tally:
    """Counts by kind and by error kind; `sent` is counted when a request goes out, so a request that
    never comes back (a client thread stuck) shows as `unaccounted`."""

    sent: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    # The first sample of each error kind.
    samples: dict[str, str] = field(default_factory=dict)

    def add(self, outcome: Outcome) -> None:
        self.kinds[outcome.kind] += 1
        if outcome.kind in (ERRORED, LOST):
            key = f"{outcome.kind}: {outcome.detail}"
            self.details[key] += 1
            self.samples.setdefault(key, outcome.sample)

    @property
    def unaccounted(self) -> int:
        return self.sent - sum(self.kinds.values())

    @property
    def lost(self) -> int:
        """Requests with neither an answer nor an error, the ones still unaccounted included."""
        return self.kinds[LOST] + self.unaccounted

    def summary(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            **{kind: self.kinds[kind] for kind in (COMPLETED, ERRORED, DISCONNECTED)},
            "lost": self.lost,
            "by_kind": dict(sorted(self.details.items())),
            "samples": {k: v for k, v in sorted(self.samples.items()) if v},
        }
