"""One soak request over plain HTTP/1.1 (http.client), judged by load.soak_outcomes.

A fresh connection per request, so a cut connection or a restarted server costs that request alone and
every failure is seen by the request that met it.
"""

from __future__ import annotations

import http.client
import json
import random
from dataclasses import dataclass

from load.soak_outcomes import DISCONNECTED, Outcome, judge_body, judge_cut


@dataclass(frozen=True)
class RequestPlan:
    path: str  # /v1/chat/completions or /v1/completions
    body: dict[str, object]
    streamed: bool
    # Hang up after the first chunk of the answer (streamed requests only).
    disconnect: bool = False


def plan_request(rng: random.Random, model: str, disconnect_share: float) -> RequestPlan:
    """A random mix: chat and completions, streamed (most) and not, short and longer answers, prompts
    that share prefixes (so KV-aware routing has something to route by)."""
    streamed = rng.random() < 0.7
    prefix = f"Soak conversation {rng.randrange(8)}: "
    text = prefix + " ".join(
        rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(rng.randint(3, 40))
    )
    max_tokens = rng.choice((4, 16, 32, 64))
    if rng.random() < 0.8:
        path = "/v1/chat/completions"
        body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": text}]}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": text}
    body |= {"max_tokens": max_tokens, "stream": streamed, "ignore_eos": True}
    disconnect = streamed and max_tokens >= 16 and rng.random() < disconnect_share
    return RequestPlan(path, body, streamed, disconnect)


def send(host: str, port: int, plan: RequestPlan, timeout_s: float) -> Outcome:
    """Send `plan`, read the answer to its end (or hang up, for a disconnect), and judge it."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    status: int | None = None
    try:
        conn.request("POST", plan.path, json.dumps(plan.body), {"content-type": "application/json"})
        response = conn.getresponse()
        status = response.status
        if plan.disconnect and status == 200:
            if response.read1(65536):
                return Outcome(DISCONNECTED)  # conn.close() below hangs up mid-stream
        body = response.read()
        return judge_body(status, body, plan.streamed)
    except (OSError, http.client.HTTPException) as error:
        return judge_cut(status, error)
    finally:
        conn.close()
