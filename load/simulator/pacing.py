"""Token timing: wait until a token is due, unless the request is aborted first."""

from __future__ import annotations

import asyncio


class Pacer:
    """Sleeps to absolute deadlines, so per-request overhead does not stretch the token rate.

    An abort has to end a request mid-sleep (a long time-to-first-token must not delay it), so the
    sleep is a future that either the timer or `wake()` resolves; no task is created per token.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self.woken = False

    def now(self) -> float:
        return self._loop.time()

    async def until(self, deadline: float) -> None:
        if self.woken:
            return
        if deadline <= self._loop.time():
            await asyncio.sleep(0)  # still yield, so a burst cannot starve other requests
            return
        waiter = self._loop.create_future()
        self._waiter = waiter
        handle = self._loop.call_at(deadline, _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            self._waiter = None

    def wake(self) -> None:
        """End the current and every later wait at once (the request was aborted)."""
        self.woken = True
        if self._waiter is not None:
            _resolve(self._waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
