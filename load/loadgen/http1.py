"""A small HTTP/1.1 client on asyncio's Protocol API, for measuring rather than for general use.

Why not a library client: the load generator shares the CPUs with the gateway it measures, so its own cost
per request must be small and steady, and stream timing must be the time bytes arrived, not the time a
library handed them over. Requests are prebuilt bytes; the response is parsed in `data_received` (status,
headers, content-length or chunked body) and body bytes go to a sink with the arrival time of the read
that carried them. Connections are kept alive and pooled; one request at a time per connection.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit


class BodySink(Protocol):
    def feed(self, data: bytes, at: float) -> None: ...


class HttpError(Exception):
    """The connection failed or the response could not be parsed."""

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        # A kept-alive connection the server had already closed: nothing was processed, try a new one.
        self.stale = stale


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE = range(7)


class Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._sink: BodySink | None = None
        self._response: Response | None = None
        self._state = _HEAD
        self._remaining = 0
        self._keep_alive = True
        self.served = 0  # responses completed on this connection

    # --- asyncio.Protocol ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            # Bytes nobody asked for: the connection is out of step, drop it.
            self._close()
            return
        self._buf += data
        try:
            self._parse(time.perf_counter())
        except (ValueError, IndexError) as exc:
            self._fail(HttpError(f"bad response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None:
            if self._state == _UNTIL_CLOSE and self._response is not None:
                self._finish()
            else:
                stale = self.served > 0 and self._response is None and not self._buf
                self._fail(HttpError(f"connection closed: {exc or 'by peer'}", stale=stale))

    # --- requests ------------------------------------------------------------------------------------

    def send(self, request: bytes, sink: BodySink) -> asyncio.Future[Response]:
        """Write a prebuilt request; the future resolves once the whole response body was fed to `sink`."""
        if self.closed or self.transport is None or self._waiter is not None:
            raise HttpError("connection not usable", stale=self.served > 0)
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._sink = sink
        self._state = _HEAD
        self._response = None
        self.transport.write(request)
        return self._waiter

    @property
    def reusable(self) -> bool:
        return not self.closed and self._waiter is None and self._keep_alive

    def abandon(self) -> None:
        """Give up on the request in flight (timeout, cancellation): the connection cannot be reused."""
        self._waiter = None
        self._close()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- parsing -------------------------------------------------------------------------------------

    def _parse(self, now: float) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(bytes(buf[:end]))
                del buf[: end + 4]
            elif state == _BODY or state == _CHUNK_DATA:
                if not buf:
                    return
                take = min(len(buf), self._remaining)
                self._sink.feed(bytes(buf[:take]), now)  # type: ignore[union-attr]
                del buf[:take]
                self._remaining -= take
                if self._remaining:
                    return
                if state == _BODY:
                    self._finish()
                    return
                self._state = _CHUNK_END
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILERS
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    self._finish()
                    return
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                del buf[: end + 4]
                self._finish()
                return
            else:  # _UNTIL_CLOSE
                if buf:
                    self._sink.feed(bytes(buf), now)  # type: ignore[union-attr]
                    buf.clear()
                return

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not HTTP/1.x: {lines[0]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        code = int(status)
        if 100 <= code < 200:  # an interim response: the real one follows
            return
        self._response = Response(code, headers)
        self._keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            self._remaining = int(headers["content-length"])
            self._state = _BODY
            if not self._remaining:
                self._finish()
        else:
            self._keep_alive = False
            self._state = _UNTIL_CLOSE

    def _finish(self) -> None:
        waiter, response = self._waiter, self._response
        self._waiter = self._sink = None
        self._state = _HEAD
        self.served += 1
        if not self._keep_alive:
            self._close()
        if waiter is not None and not waiter.done() and response is not None:
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        self._waiter = self._sink = None
        self._close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class ConnectionPool:
    """Keep-alive connections to one origin; grows to as many as requests in flight."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()

    async def acquire(self) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:
                return conn
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(Connection, self.host, self.port)
        except OSError as exc:
            raise HttpError(f"connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        self._all.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.abandon()
            self._all.discard(conn)

    def build_request(self, method: str, path: str, body: bytes, content_type: str) -> bytes:
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def close(self) -> None:
        for conn in self._all:
            conn.abandon()
        self._all.clear()
        self._idle.clear()
