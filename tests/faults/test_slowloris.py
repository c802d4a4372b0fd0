"""Slow and greedy clients at the edge (issue 15: "no request-header or upload timeout: 300 slowloris
connections stay open indefinitely, each holding an ext_proc stream"; no connection limit below the
descriptor limit).

- 300 connections that trickle a request head they never finish are closed once the request-header timeout
  passes, while unrelated requests keep being served;
- a client that sends its headers but trickles its body gets a 408 once the request timeout passes, and the
  ext_proc stream its request opened is released;
- past the client connection cap, a new connection is closed as soon as it is accepted, without a
  response, while the open ones keep working and a connection freed makes room for a new one.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FreePorts
from tests.faults.envoy_stats import stat
from tests.integration.harness import Stack, local_stack, wait_for

HEADERS_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 3.0
CONNECTION_CAP = 400
SLOW_CLIENTS = 300
# Generous on a busy 2-core machine: Envoy checks timers on its one worker thread.
MARGIN_S = 8.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    overrides = {
        "request_headers_timeout_s": HEADERS_TIMEOUT_S,
        "request_timeout_s": REQUEST_TIMEOUT_S,
        "max_downstream_connections": CONNECTION_CAP,
    }
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("edge")), envoy_overrides=overrides) as s:
        yield s


def _address(stack: Stack) -> tuple[str, int]:
    host, port = stack.base_url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(stack: Stack) -> socket.socket:
    sock = socket.create_connection(_address(stack), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Received:
    """What the server sent on each connection so far, read without blocking."""

    def __init__(self) -> None:
        self.data: dict[socket.socket, bytes] = {}

    def closed(self, sock: socket.socket) -> bool:
        """Read what is there; True once the server has closed the connection."""
        sock.setblocking(False)
        try:
            while chunk := sock.recv(65536):
                self.data[sock] = self.data.get(sock, b"") + chunk
        except BlockingIOError:
            return False
        except ConnectionResetError:
            pass
        return True


def _read_to_close(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _chat(stack: Stack) -> float:
    """One short chat completion; its latency in seconds."""
    start = time.monotonic()
    reply = stack.openai(timeout=30).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content
    return time.monotonic() - start


def _active_clients(stack: Stack) -> int:
    host, port = _address(stack)
    return stat(stack.admin_url, f"listener.{host}_{port}.downstream_cx_active")


def test_slowloris_connections_are_closed_and_others_are_served(stack: Stack) -> None:
    baseline = max(_chat(stack) for _ in range(3))
    slow = [_connect(stack) for _ in range(SLOW_CLIENTS)]
    # Half trickle a header line every 250 ms, half go quiet after the first line.
    trickling, quiet = slow[::2], slow[1::2]
    opened = time.monotonic()
    try:
        for sock in slow:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n")
        # Unrelated requests are served meanwhile, about as fast as before.
        latencies = [_chat(stack) for _ in range(3)]
        assert max(latencies) < baseline + 5.0, (baseline, latencies)
        # Trickling more header lines does not extend the deadline: it bounds the whole head.
        open_socks, received = list(slow), Received()
        line = 0
        while open_socks and time.monotonic() - opened < HEADERS_TIMEOUT_S + MARGIN_S:
            still_open = []
            for sock in open_socks:
                if received.closed(sock):
                    continue
                still_open.append(sock)
                if sock in trickling:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        sock.sendall(f"x-slow-{line}: 1\r\n".encode())
            open_socks, line = still_open, line + 1
            time.sleep(0.25)
        closed_after = time.monotonic() - opened
        assert not open_socks, f"{len(open_socks)} of {SLOW_CLIENTS} slow connections still open"
        assert closed_after >= HEADERS_TIMEOUT_S - 0.5, "closed before the timeout: not the timeout's doing"
        # A quiet one is told why before the close (a trickling one may not read it: a close with its
        # unread bytes pending makes the kernel reset the connection, which drops the answer).
        told = [received.data.get(sock, b"")[:30] for sock in quiet]
        assert all(a.startswith(b"HTTP/1.1 408") for a in told), set(told)
        # Envoy's 408 runs through the ext_proc filter: none of those streams stays open.
        assert wait_for(lambda: stat(stack.admin_url, "cluster.extproc.upstream_rq_active") == 0)
        # And the gateway still serves.
        _chat(stack)
    finally:
        for sock in slow:
            sock.close()


def test_a_slow_upload_gets_408_and_releases_its_ext_proc_stream(stack: Stack) -> None:
    sock = _connect(stack)
    try:
        body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 1000 + b'"}]}'
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode())
        assert wait_for(lambda: stat(stack.admin_url, "cluster.extproc.upstream_rq_active") >= 1), (
            "the request's ext_proc stream never opened"
        )
        start = time.monotonic()
        for offset in range(len(body)):  # one byte every 50 ms: 50 s for the body
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered
            sock.sendall(body[offset : offset + 1])
            assert time.monotonic() - start < REQUEST_TIMEOUT_S + MARGIN_S, "the slow upload was never cut"
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        response = _read_to_close(sock)
        assert response.startswith(b"HTTP/1.1 408"), response
        assert b"application/json" in response and b'"request_timeout"' in response, response
        assert elapsed >= REQUEST_TIMEOUT_S - 1.0, elapsed
        assert wait_for(lambda: stat(stack.admin_url, "cluster.extproc.upstream_rq_active") == 0), (
            "the ext_proc stream of the cut request stayed open"
        )
    finally:
        sock.close()


def test_connections_past_the_cap_are_closed_at_once(stack: Stack) -> None:
    host, port = _address(stack)
    overflow = f"listener.{host}_{port}.downstream_global_cx_overflow"
    before = stat(stack.admin_url, overflow)
    held: list[socket.socket] = []
    try:
        while len(held) < CONNECTION_CAP and _active_clients(stack) < CONNECTION_CAP:
            held.extend(_connect(stack) for _ in range(CONNECTION_CAP - _active_clients(stack)))
            wait_for(lambda: _active_clients(stack) >= min(CONNECTION_CAP, len(held)), timeout=5)
        assert _active_clients(stack) == CONNECTION_CAP

        # One more: accepted by the kernel, then closed by Envoy without a byte of response.
        extra = _connect(stack)
        try:
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = Received()
        assert wait_for(lambda: received.closed(extra), timeout=5)
        assert received.data.get(extra, b"") == b"", "the connection past the cap was served"
        extra.close()
        assert stat(stack.admin_url, overflow) > before

        # The open connections still work.
        ours = held[0]
        ours.setblocking(True)
        ours.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert ours.recv(65536).startswith(b"HTTP/1.1 200"), "an open connection stopped working"

        # A connection freed makes room for a new one.
        held.pop().close()
        assert wait_for(lambda: _active_clients(stack) < CONNECTION_CAP)
        _chat(stack)
    finally:
        for sock in held:
            sock.close()
