"""A small HTTP endpoint per engine: `GET /metrics` (Prometheus), `GET|POST|DELETE /faults`, and
`GET|POST|DELETE /script` (scripted outputs: POST adds rules, checked before the configured ones; DELETE
forgets the added ones; each answers the rules left, with their remaining counts), and `GET|POST|DELETE
/timing` (step times and tokens per message, `EngineCore.retime`: POST changes some, DELETE restores the
start's; each answers the timing now; benchmarks switch it per workload), and `POST /restart`
(`{"down_s": 2}`: the engine restarts as a new process would, down that long, answered once it is back:
`SimEngine.restart`).

Plain asyncio streams, one request per connection: scrapes and fault switches are rare, and the
simulator stays free of web-framework dependencies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from extproc.simulator import metrics
from extproc.simulator.script import parse_rules

if TYPE_CHECKING:
    from extproc.simulator.core import EngineCore

MAX_BODY = 64 * 1024


Restart = Callable[[float], Awaitable[None]]


class ControlServer:
    def __init__(self, core: EngineCore, restart: Restart) -> None:
        self.core = core
        self._restart = restart  # the hosting engine's, which owns the server a restart stops
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, content_type, body = await self._respond(reader)
        except (ValueError, asyncio.IncompleteReadError, json.JSONDecodeError) as e:
            status, content_type, body = 400, "application/json", json.dumps({"error": str(e)})
        payload = body.encode()
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + payload)
            await writer.drain()
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[int, str, str]:
        request_line = (await reader.readline()).decode("latin-1").split()
        if len(request_line) < 2:
            raise ValueError("bad request line")
        method, path = request_line[0], request_line[1].split("?", 1)[0]
        length = 0
        while (line := (await reader.readline()).decode("latin-1").strip()) != "":
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length > MAX_BODY:
            raise ValueError("body too large")
        body = (await reader.readexactly(length)).decode() if length else ""
        faults = self.core.faults
        if path == "/metrics" and method == "GET":
            return 200, "text/plain; version=0.0.4; charset=utf-8", metrics.render(self.core)
        if path == "/faults":
            if method == "POST":
                changes = json.loads(body or "{}")
                if not isinstance(changes, dict):
                    raise ValueError("a JSON object of fault settings is expected")
                faults.set(**changes)
            elif method == "DELETE":
                faults.clear()
            elif method != "GET":
                return 405, "application/json", json.dumps({"error": "method not allowed"})
            return 200, "application/json", json.dumps(faults.as_dict())
        if path == "/script":
            script = self.core.script
            if method == "POST":
                script.add(parse_rules(json.loads(body or "null")))
            elif method == "DELETE":
                script.clear()
            elif method != "GET":
                return 405, "application/json", json.dumps({"error": "method not allowed"})
            return 200, "application/json", json.dumps(script.as_list())
        if path == "/timing":
            if method == "POST":
                changes = json.loads(body or "{}")
                if not isinstance(changes, dict):
                    raise ValueError("a JSON object of timing options is expected")
                self.core.retime(**changes)
            elif method == "DELETE":
                self.core.retime()
            elif method != "GET":
                return 405, "application/json", json.dumps({"error": "method not allowed"})
            return 200, "application/json", json.dumps(self.core.timing())
        if path == "/restart" and method == "POST":
            options = json.loads(body or "{}")
            if not isinstance(options, dict):
                raise ValueError('a JSON object is expected: {"down_s": seconds}')
            down_s = options.get("down_s", 0.0)
            if isinstance(down_s, bool) or not isinstance(down_s, int | float):
                raise ValueError("down_s must be a number of seconds")
            await self._restart(float(down_s))
            return 200, "application/json", json.dumps({"restarted": True, "down_s": down_s})
        return 404, "application/json", json.dumps({"error": f"no route {method} {path}"})
