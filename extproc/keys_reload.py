"""API keys reloaded without a restart: the keys file is polled for changes (and read at once on SIGHUP).

A change is noticed by the file's modification time, size or inode (a file replaced by a rename, as
editors and `mv` do, counts). The new file is parsed whole before anything changes: a file that does not
parse (say, caught half-written) is logged and the keys in force stay; a good one replaces them in one
step in the native gateway, where every request reads the keys once, at its headers, so a request sees
either the old keys or the new ones. A deleted file keeps the keys in force too (an operator removes
keys by removing their lines, not the file). Rate-limit buckets start full again for every key after a
reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog

from extproc import _native, api_keys

log = structlog.get_logger("extproc.keys")

POLL_INTERVAL_S = 0.5
Signature = tuple[int, int, int]


def file_signature(path: Path) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class KeysReloader:
    """Keeps `gateway`'s API keys in step with `path` (already loaded once by the caller)."""

    def __init__(
        self, gateway: _native.Gateway, path: Path, poll_interval_s: float = POLL_INTERVAL_S
    ) -> None:
        self._gateway = gateway
        self._path = path
        self._poll_interval_s = poll_interval_s
        self._seen = file_signature(path)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.reloads = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def reload_now(self) -> None:
        """Check the file at once (SIGHUP); safe from a signal handler on the loop."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def check(self, force: bool = False) -> bool:
        """Reload if the file changed (or `force`); True when new keys are in force."""
        signature = file_signature(self._path)
        if signature is None:
            if self._seen is not None:
                log.warning("API keys file is gone; keeping the keys in force", file=str(self._path))
                self._seen = None
            return False
        if signature == self._seen and not force:
            return False
        self._seen = signature
        try:
            keys = api_keys.load_keys(self._path)
            self._gateway.set_api_keys([k.as_native() for k in keys])
        except ValueError as e:  # KeysFileError, or an entry the gateway refused
            log.error(
                "API keys file not reloaded; keeping the keys in force", file=str(self._path), error=str(e)
            )
            return False
        self.reloads += 1
        log.info("API keys reloaded", keys=len(keys), file=str(self._path))
        return True

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_interval_s)
            forced = self._wake.is_set()
            self._wake.clear()
            # Parsing a large file is not the event loop's business.
            await asyncio.to_thread(self.check, forced)
