"""The load generator's OpenAI target, plus what routing needs: each request's session key in the `user`
field, and the prefix hit the engine reported for it (`usage.prompt_tokens_details.cached_tokens` of a
stream's usage chunk, which both gateways pass through from the engine; every request of the trace
streams).

`Record` (load.loadgen) has no field for the cached tokens, so they are kept beside the records, by
record identity: `cached_tokens(record)`, noted by hooking the base class's `_stream_result` (a
`cached_tokens` field on `Record`, set where the usage is read, would make the hook unnecessary). The
records live as long as the run's result, so an identity is never reused while it is looked up.
"""

from __future__ import annotations

from typing import Any

from load.loadgen.openai_target import OpenAITarget
from load.loadgen.records import Record
from load.loadgen.workloads import ChatSpec


class RoutingTarget(OpenAITarget):
    def __init__(self, base_url: str, model: str) -> None:
        # Every answer exactly max_tokens long: the same decode work whatever engine serves it.
        super().__init__(base_url, model, ignore_eos=True)
        self._cached: dict[int, int] = {}

    def body(self, spec: ChatSpec) -> dict[str, Any]:
        body = super().body(spec)
        user = getattr(spec, "user", "")
        if user:
            body["user"] = user
        return body

    def _stream_result(self, record: Record, sink: Any, start: float) -> None:  # type: ignore[override]
        OpenAITarget._stream_result(record, sink, start)
        self._note(record, sink.usage)

    def _note(self, record: Record, usage: dict[str, Any] | None) -> None:
        details = (usage or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if isinstance(cached, int):
            self._cached[id(record)] = cached

    def cached_tokens(self, record: Record) -> int | None:
        return self._cached.get(id(record))
