"""The soak's accounting (load.soak_outcomes, load.soak_client) against a scripted HTTP server that
answers each way a gateway can: every request is counted once, as completed, errored (by the kind the
client saw), disconnected or lost, and the ones that got neither an answer nor an error are the lost
ones. Seconds, not the soak itself (`make soak`)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from load.soak_client import RequestPlan, send
from load.soak_outcomes import COMPLETED, DISCONNECTED, ERRORED, LOST, Outcome, Tally

CLIENT_TIMEOUT_S = 1.0
ANSWER = json.dumps({"choices": [{"index": 0, "message": {"content": "hi"}}]}).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Scripted(BaseHTTPRequestHandler):
    """The path names the behaviour."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _head(self, status: int, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        if length is None:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()

    def _events(self, events: list[str], end: bool = True) -> None:
        self._head(200, "text/event-stream")
        for event in events:
            self.wfile.write(_chunk(f"data: {event}\n\n".encode()))
            self.wfile.flush()
        if end:
            self.wfile.write(b"0\r\n\r\n")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        path = self.path.strip("/")
        token = json.dumps({"choices": [{"delta": {"content": "x"}}]})
        if path == "answer":
            self._head(200, "application/json", len(ANSWER))
            self.wfile.write(ANSWER)
        elif path == "stream":
            self._events([token, token, "[DONE]"])
        elif path == "stream-error":
            self._events([token, json.dumps({"error": {"code": 504, "message": "deadline"}}), "[DONE]"])
        elif path == "unavailable":
            body = json.dumps({"error": {"code": 503, "message": "no engine"}}).encode()
            self._head(503, "application/json", len(body))
            self.wfile.write(body)
        elif path == "stream-cut":  # the connection drops mid-stream: the client sees the cut
            self._events([token], end=False)
            self.connection.shutdown(socket.SHUT_RDWR)
        elif path == "stream-no-done":  # a clean end with neither [DONE] nor an error: lost
            self._events([token])
        elif path == "empty-200":
            self._head(200, "application/json", 2)
            self.wfile.write(b"{}")
        elif path == "hang":  # nothing, ever (within the client's timeout): lost
            time.sleep(CLIENT_TIMEOUT_S * 3)
        elif path == "hang-mid-stream":
            self._events([token], end=False)
            time.sleep(CLIENT_TIMEOUT_S * 3)
        self.close_connection = True


@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _send(port: int, path: str, streamed: bool, disconnect: bool = False) -> Outcome:
    return send("127.0.0.1", port, RequestPlan(f"/{path}", {"x": 1}, streamed, disconnect), CLIENT_TIMEOUT_S)


@pytest.mark.parametrize(
    "path,streamed,kind,detail",
    [
        ("answer", False, COMPLETED, ""),
        ("stream", True, COMPLETED, ""),
        ("stream-error", True, ERRORED, "sse 504"),
        ("unavailable", True, ERRORED, "http 503"),
        ("stream-cut", True, ERRORED, "cut after 200: IncompleteRead"),
        ("stream-no-done", True, LOST, "stream ended without [DONE] or an error event"),
        ("empty-200", False, LOST, "200 without choices"),
        ("hang", False, LOST, "timeout"),
        ("hang-mid-stream", True, LOST, "timeout mid-answer"),
    ],
)
def test_each_ending_is_judged_as_the_client_saw_it(
    server_port: int, path: str, streamed: bool, kind: str, detail: str
) -> None:
    outcome = _send(server_port, path, streamed)
    assert (outcome.kind, outcome.detail) == (kind, detail)


def test_a_refused_connection_is_an_error_the_client_saw() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        outcome = _send(port, "answer", False)
    assert (outcome.kind, outcome.detail) == (ERRORED, "connection ConnectionRefusedError")


def test_a_hang_up_is_a_disconnect_not_an_error(server_port: int) -> None:
    assert _send(server_port, "stream", True, disconnect=True).kind == DISCONNECTED
    # A disconnect planned on a request that failed first counts as that failure.
    assert _send(server_port, "unavailable", True, disconnect=True).kind == ERRORED


def test_the_tally_counts_each_request_once_and_a_request_never_judged_as_lost(server_port: int) -> None:
    tally = Tally()
    for path, streamed in [
        ("answer", False),
        ("stream", True),
        ("unavailable", False),
        ("stream-error", True),
    ]:
        tally.sent += 1
        tally.add(_send(server_port, path, streamed))
    tally.sent += 1
    tally.add(_send(server_port, "stream-no-done", True))
    tally.sent += 1  # sent, and its client never came back
    summary = tally.summary()
    assert {k: summary[k] for k in ("sent", "completed", "errored", "disconnected", "lost")} == {
        "sent": 6,
        "completed": 2,
        "errored": 2,
        "disconnected": 0,
        "lost": 2,
    }
    assert summary["by_kind"] == {
        "errored: http 503": 1,
        "errored: sse 504": 1,
        "lost: stream ended without [DONE] or an error event": 1,
    }
    assert "no engine" in str(summary["samples"])
