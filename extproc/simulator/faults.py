"""Faults on demand: what a test or an operator can make a simulated engine do wrong.

Set in-process (`SimEngine.faults.set(...)`), over HTTP (`POST /faults` on the engine's metrics port with
the same fields as JSON; `GET /faults` reads them; `DELETE /faults` clears them), or for every engine at
start (`--faults JSON` on the CLI):

- `fail_code` / `fail_message` / `fail_count`: Generate fails with that gRPC status before any token
  (`fail_count` calls, -1 for all, default all);
- `die_after_tokens`: a Generate stream is cut after that many tokens with UNAVAILABLE, as a connection
  to an engine that crashed ends;
- `stall`: the scheduler stops stepping: streams stay open and silent (HealthCheck still answers, as
  vLLM's servicer does while its core hangs);
- `slow`: every step takes this many times longer;
- `unhealthy`: HealthCheck answers healthy=false;
- `health_delay_s` / `health_delay_count`: HealthCheck answers that many seconds late (`health_delay_count`
  calls, -1 for all, default all), as a busy engine's servicer or one still warming up after a restart;
- `refuse`: the engine's port stops accepting connections (the server is stopped) until cleared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from extproc.simulator.scheduler import Faults


@dataclass
class FaultSettings:
    fail_code: str | None = None  # a grpc.StatusCode name, e.g. "UNAVAILABLE"
    fail_message: str = "injected fault"
    fail_count: int = -1
    die_after_tokens: int | None = None
    stall: bool = False
    slow: float = 1.0
    unhealthy: bool = False
    health_delay_s: float = 0.0
    health_delay_count: int = -1
    refuse: bool = False


class FaultPlan:
    def __init__(self) -> None:
        self.settings = FaultSettings()
        self.engine = Faults()  # the scheduler's view: stall and slow
        # Set by the hosting server: stops or restarts its port when `refuse` changes.
        self.on_refuse: Callable[[bool], Any] | None = None

    def set(self, **changes: Any) -> FaultSettings:
        """Change some settings (unknown names and bad values raise ValueError)."""
        merged = {**asdict(self.settings), **changes}
        unknown = set(merged) - set(asdict(FaultSettings()))
        if unknown:
            raise ValueError(f"unknown fault settings: {sorted(unknown)}")
        settings = FaultSettings(**merged)
        if settings.fail_code is not None:
            status_code(settings.fail_code)  # validates the name
        if settings.slow <= 0:
            raise ValueError("slow must be positive")
        if settings.health_delay_s < 0:
            raise ValueError("health_delay_s must be zero or positive")
        previous_refuse = self.settings.refuse
        self.settings = settings
        self.engine.slow = settings.slow
        self.engine.stall(settings.stall)
        if settings.refuse != previous_refuse and self.on_refuse is not None:
            self.on_refuse(settings.refuse)
        return settings

    def clear(self) -> FaultSettings:
        return self.set(**asdict(FaultSettings()))

    def take_failure(self) -> tuple[grpc.StatusCode, str] | None:
        """The status a Generate call should fail with now, counting it down; None to serve it."""
        settings = self.settings
        if settings.fail_code is None or settings.fail_count == 0:
            return None
        if settings.fail_count > 0:
            settings.fail_count -= 1
        return status_code(settings.fail_code), settings.fail_message

    async def delay_health_check(self) -> None:
        """Waits as long as a HealthCheck call should before answering, counting the delayed calls down."""
        settings = self.settings
        if settings.health_delay_s == 0 or settings.health_delay_count == 0:
            return
        if settings.health_delay_count > 0:
            settings.health_delay_count -= 1
        await asyncio.sleep(settings.health_delay_s)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self.settings)


def status_code(name: str) -> grpc.StatusCode:
    try:
        code = grpc.StatusCode[name.upper()]
    except KeyError:
        raise ValueError(f"unknown gRPC status {name!r}") from None
    if code is grpc.StatusCode.OK:
        raise ValueError("a failure needs a status other than OK")
    return code
