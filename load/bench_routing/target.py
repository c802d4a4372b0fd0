"""The load generator's OpenAI target, plus what routing needs: each request's session key in the `user`
field. The prefix hit the engine reported for a request comes back on its record (`Record.cached_tokens`,
from the usage both gateways pass through from the engine; every request of the trace streams).
"""

from __future__ import annotations

import time
from typing import Any

from load.loadgen.openai_target import OpenAITarget, Prepared
from load.loadgen.records import Record
from load.loadgen.workloads import ChatSpec


class RoutingTarget(OpenAITarget):
    def __init__(self, base_url: str, model: str) -> None:
        # Every answer exactly max_tokens long: the same decode work whatever engine serves it.
        super().__init__(base_url, model, ignore_eos=True)

    def body(self, spec: ChatSpec) -> dict[str, Any]:
        body = super().body(spec)
        user = getattr(spec, "user", "")
        if user:
            body["user"] = user
        return body


class SplitTarget:
    """Requests spread over one or more gateways' front doors (gateway replicas), each request's spec
    kept beside its record (`turns`) for the per-turn analysis (`followups.py`).

    `prepare(spec)` takes the next front door in turn (open loop: arrival i to door i mod n);
    `prepare(spec, via=k)` a fixed one (closed loop: client k's door).
    """

    def __init__(self, base_urls: list[str], model: str) -> None:
        if not base_urls:
            raise ValueError("no gateway to send to")
        self.doors = [RoutingTarget(url, model) for url in base_urls]
        self.turns: list[tuple[ChatSpec, Record]] = []
        # The wall time of the records' zero (their `start`s count from a perf_counter origin), to join
        # them to what the engines logged.
        self.wall0: float | None = None
        self._next = 0

    def prepare(self, spec: ChatSpec, via: int | None = None) -> tuple[ChatSpec, int, Prepared]:
        if via is None:
            via, self._next = self._next, self._next + 1
        door = via % len(self.doors)
        return spec, door, self.doors[door].prepare(spec)

    async def send(self, prepared: tuple[ChatSpec, int, Prepared], run_start: float) -> Record:
        spec, door, request = prepared
        if self.wall0 is None:
            self.wall0 = time.time() - (time.perf_counter() - run_start)
        record = await self.doors[door].send(request, run_start)
        self.turns.append((spec, record))
        return record

    def close(self) -> None:
        for door in self.doors:
            door.close()
