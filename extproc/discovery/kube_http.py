"""A small HTTP/1.1 GET client for the Kubernetes API, on asyncio streams (the standard library has no
asyncio HTTP client, and a watch is one response that lasts minutes): bearer token, optional TLS, bodies
sent whole, chunked or until the connection closes, read as one JSON document or line by line.

Where the API is: `ApiServer.in_cluster()` from the pod's environment and service-account files, or a URL
(`kubectl proxy`, or a test's fake server).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONNECT_TIMEOUT_S = 10.0
HEAD_TIMEOUT_S = 30.0
MAX_HEAD_LINES = 200


class ApiUnavailable(Exception):
    """The API server could not be found, reached or understood."""


class HttpStatus(Exception):
    """The API answered with a status other than 200."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class ApiServer:
    """Where the Kubernetes API is and how to authenticate to it."""

    # scheme://host:port[/prefix], no trailing slash
    url: str
    # Re-read at every connection: projected service-account tokens rotate.
    token_file: str | None = None
    ca_file: str | None = None

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR
    ) -> ApiServer:
        """The API of the cluster this pod runs in; ApiUnavailable outside one."""
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ApiUnavailable(
                "not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST/PORT): set kubernetes_api, e.g. "
                "http://127.0.0.1:8001 for `kubectl proxy`"
            )
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", *cls.account_files(account_dir))

    @staticmethod
    def account_files(account_dir: Path = SERVICE_ACCOUNT_DIR) -> tuple[str | None, str | None]:
        """The service account's token and CA files, each None when absent."""
        token, ca = account_dir / "token", account_dir / "ca.crt"
        return (str(token) if token.is_file() else None, str(ca) if ca.is_file() else None)

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=self.ca_file)

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            return Path(self.token_file).read_text().strip() or None
        except OSError as e:
            raise ApiUnavailable(f"cannot read the token file {self.token_file}: {e.strerror or e}") from None

    async def get(self, path: str) -> Response:
        """GET `path` (with its query); the response's head is read, its body left to the caller."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        tls = self._ssl()
        port = parts.port or (443 if tls else 80)
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (the watch
            # then outlives its task).
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None
                )
        except (OSError, TimeoutError, ssl.SSLError) as e:
            raise ApiUnavailable(f"cannot connect to {self.url}: {e}") from None
        lines = [
            f"GET {parts.path}{path} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Accept: application/json",
            "User-Agent: extproc-discovery",
            "Connection: close",
        ]
        token = self._token()
        if token:
            lines.append(f"Authorization: Bearer {token}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = Response(reader, writer)
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                await response.read_head()
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as e:
            response.close()
            raise ApiUnavailable(f"no answer from {self.url}: {e or type(e).__name__}") from None
        return response


class Response:
    """One HTTP response: status and headers, then its body once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.status = 0
        self.headers: dict[str, str] = {}

    async def read_head(self) -> None:
        status_line = (await self._reader.readline()).decode("latin-1").split()
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
            raise ValueError(f"not an HTTP response: {' '.join(status_line)!r}")
        self.status = int(status_line[1])
        for _ in range(MAX_HEAD_LINES):
            line = (await self._reader.readline()).decode("latin-1").strip()
            if not line:
                return
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        raise ValueError("too many header lines")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await self._reader.readline()
                if not size_line:
                    raise asyncio.IncompleteReadError(b"", None)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                data = await self._reader.readexactly(size)
                await self._reader.readexactly(2)  # the CRLF after each chunk
                yield data
        elif "content-length" in self.headers:
            yield await self._reader.readexactly(int(self.headers["content-length"]))
        else:
            while data := await self._reader.read(65536):
                yield data

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line (a watch sends one JSON event a line), however it was chunked."""
        pending = b""
        async for data in self.chunks():
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line
        if pending.strip():
            yield pending

    async def json(self) -> Any:
        body = b"".join([data async for data in self.chunks()])
        return json.loads(body)

    async def error(self) -> HttpStatus:
        """A non-200 answer as an exception, with the API's message when it sent a Status."""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                body = await self.json()
            message = str(body.get("message") or body) if isinstance(body, dict) else str(body)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            message = "(no readable body)"
        return HttpStatus(self.status, message[:300])

    def close(self) -> None:
        self._writer.close()
