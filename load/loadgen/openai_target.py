"""The target for an OpenAI-compatible server: POST /v1/chat/completions over the pooled HTTP/1.1 client.

Requests are rendered to bytes before a run (`prepare`), so a run spends its client CPU on the wire and the
parsing only. Streams are read event by event as they arrive: the first event that carries generated text
gives the TTFT, each later one an inter-token gap; the usage chunk (requested with `include_usage`) gives
token counts and the prompt's cached tokens, as does the usage object of a plain answer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from load.loadgen.http1 import ConnectionPool, HttpError
from load.loadgen.records import Record
from load.loadgen.workloads import ChatSpec

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Prepared:
    kind: str
    stream: bool
    request: bytes


class _Collect:
    """A plain body: keep the bytes."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def feed(self, data: bytes, at: float) -> None:
        self.chunks.append(data)

    def body(self) -> bytes:
        return b"".join(self.chunks)


class _SseTimes:
    """A server-sent-events body: arrival time of every event with text, and the usage."""

    __slots__ = ("buf", "done", "error", "times", "usage")

    def __init__(self) -> None:
        self.buf = b""
        self.times: list[float] = []
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, data: bytes, at: float) -> None:
        buf = self.buf + data
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            self._event(buf[start:end], at)
            start = end + 2
        self.buf = buf[start:]

    def _event(self, event: bytes, at: float) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return
            chunk = json.loads(data)
            if "error" in chunk:
                self.error = str(chunk["error"].get("message", chunk["error"]))[:200]
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    self.times.append(at)
                    break


class OpenAITarget:
    """Chat completions against `base_url` (e.g. http://127.0.0.1:8080)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 300.0,
        ignore_eos: bool = False,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.pool = ConnectionPool(base_url)
        self.model = model
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.extra_body = extra_body or {}

    def body(self, spec: ChatSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": spec.openai_messages(),
            "max_tokens": spec.max_tokens,
            "stream": spec.stream,
        }
        if spec.tools:
            body["tools"] = list(spec.tools)
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            # vLLM's extension (SMG and extproc accept it): every answer is exactly max_tokens long, so
            # targets that sample differently still do the same work.
            body["ignore_eos"] = True
        body.update(self.extra_body)
        return body

    def prepare(self, spec: ChatSpec) -> Prepared:
        payload = json.dumps(self.body(spec), separators=(",", ":")).encode()
        request = self.pool.build_request("POST", CHAT_PATH, payload, "application/json")
        return Prepared(spec.kind, spec.stream, request)

    async def send(self, prepared: Prepared, run_start: float) -> Record:
        record = Record(prepared.kind, prepared.stream, time.perf_counter() - run_start)
        for attempt in (1, 2):
            conn = None
            sink: _SseTimes | _Collect = _SseTimes() if prepared.stream else _Collect()
            try:
                conn = await self.pool.acquire()
                start = time.perf_counter()  # a new connection's handshake is not the gateway's time
                record.start = start - run_start
                async with asyncio.timeout(self.timeout_s):
                    response = await conn.send(prepared.request, sink)
                end = time.perf_counter()
            except (HttpError, TimeoutError, OSError) as exc:
                if conn is not None:
                    conn.abandon()
                if attempt == 1 and isinstance(exc, HttpError) and exc.stale:
                    continue  # the server closed an idle connection as we reused it: not an error
                record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                return record
            except asyncio.CancelledError:
                if conn is not None:
                    conn.abandon()
                raise
            break
        assert conn is not None
        self.pool.release(conn)
        record.status = response.status
        record.latency = end - start
        if isinstance(sink, _SseTimes) and response.status == 200:
            self._stream_result(record, sink, start)
        else:
            self._plain_result(record, sink.body() if isinstance(sink, _Collect) else sink.buf)
        return record

    @staticmethod
    def _stream_result(record: Record, sink: _SseTimes, start: float) -> None:
        times = sink.times
        if times:
            record.ttft = times[0] - start
            record.itl = [b - a for a, b in itertools.pairwise(times)]
        _usage(record, sink.usage)
        if sink.error:
            record.error = f"stream error: {sink.error}"
        elif not sink.done:
            record.error = "stream ended without [DONE]"

    @staticmethod
    def _plain_result(record: Record, body: bytes) -> None:
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        if record.status != 200:
            error = parsed.get("error") if isinstance(parsed, dict) else None
            message = error.get("message") if isinstance(error, dict) else body[:200].decode(errors="replace")
            record.error = f"HTTP {record.status}: {message}"
            return
        _usage(record, parsed.get("usage") if isinstance(parsed, dict) else None)

    def close(self) -> None:
        self.pool.close()


def _usage(record: Record, usage: dict[str, Any] | None) -> None:
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = usage.get("completion_tokens")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if isinstance(cached, int):
            record.cached_tokens = cached
