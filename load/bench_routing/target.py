"""The load generator's OpenAI target, plus what routing needs: each request's session key in the `user`
field. The prefix hit the engine reported for a request comes back on its record (`Record.cached_tokens`,
from the usage both gateways pass through from the engine; every request of the trace streams).
"""

from __future__ import annotations

from typing import Any

from load.loadgen.openai_target import OpenAITarget
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
