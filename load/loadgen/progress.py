"""A one-line progress bar on stderr, redrawn at most a few times a second (cheap enough under load)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_S = 0.5


class Progress:
    def __init__(
        self, label: str, total: int | None, *, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = 0
        self.errors = 0
        self._started = time.monotonic()
        self._drawn = 0.0
        self._tty = self.stream.isatty()

    def update(self, ok: bool) -> None:
        self.done += 1
        self.errors += not ok
        if self.enabled:
            now = time.monotonic()
            # Not a terminal (a log file, CI): a line every few seconds instead of redrawing.
            if now - self._drawn >= (REDRAW_S if self._tty else 5.0):
                self._drawn = now
                self._draw(now)

    def _draw(self, now: float, end: str = "") -> None:
        elapsed = now - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            filled = int(20 * min(self.done / self.total, 1.0))
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total}"
        else:
            bar = f"{self.done}"
        line = f"{self.label} {bar} {rate:.0f} req/s {elapsed:.0f}s errors {self.errors}"
        self.stream.write(("\r" + line + "\x1b[K" + end) if self._tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self._draw(time.monotonic(), end="\n")
