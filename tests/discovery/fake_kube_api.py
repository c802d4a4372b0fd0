"""A fake Kubernetes API server for discovery tests: EndpointSlices listed and watched over HTTP as the
real API serves them.

- `GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=S`
  lists the matching slices with the current resourceVersion;
- the same with `watch=1&resourceVersion=RV` streams, chunked, one JSON event a line: every change after
  RV (ADDED, MODIFIED, DELETED), BOOKMARKs when `allowWatchBookmarks` is set, until `timeoutSeconds`;
- a watch from a version older than the retained history gets `ERROR` with a 410 Status (`Expired`), as
  the real API answers (or, with `gone_as_status`, an HTTP 410).

A test changes slices with `put`/`delete`, and makes trouble with `expire` (forget history),
`end_watches` (the server ends open watches), `fail_with` (answer every request with an error status) and
`split_events` (each event line in two chunks, so chunks and lines never align).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/apis/discovery.k8s.io/v1/namespaces/"
SERVICE_LABEL = "kubernetes.io/service-name"


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[tuple[str, dict[str, bool]]],
    ports: list[tuple[str | None, int]],
    *,
    namespace: str = "inference",
    address_type: str = "IPv4",
) -> dict[str, Any]:
    """An EndpointSlice object: `endpoints` as (address, conditions), `ports` as (name, port)."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "labels": {SERVICE_LABEL: service}},
        "addressType": address_type,
        "endpoints": [
            {
                "addresses": [address],
                "conditions": conditions,
                "targetRef": {"kind": "Pod", "name": f"pod-{i}"},
            }
            for i, (address, conditions) in enumerate(endpoints)
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"} for port_name, port in ports],
    }


READY = {"ready": True, "serving": True, "terminating": False}
DRAINING = {"ready": False, "serving": True, "terminating": True}


@dataclass
class _Event:
    version: int
    kind: str
    obj: dict[str, Any]


class FakeKubeApi:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._version = 100
        self._slices: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: list[_Event] = []
        # Watches from a version below this get 410.
        self._oldest = 0
        self._watch_generation = 0
        self._stopping = False
        self.failure: int | None = None
        self.gone_as_status = False
        self.split_events = False
        # (watch or list, resourceVersion asked) per request, and the Authorization headers seen.
        self.requests: list[tuple[str, str | None]] = []
        self.authorizations: list[str | None] = []
        self.open_watches = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # --- what tests change ----------------------------------------------------------------------------------

    def put(self, obj: dict[str, Any]) -> int:
        """Create or replace a slice; returns its new resourceVersion."""
        with self._lock:
            self._version += 1
            obj = copy.deepcopy(obj)
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            kind = "MODIFIED" if key in self._slices else "ADDED"
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._slices[key] = obj
            self._events.append(_Event(self._version, kind, obj))
            self._lock.notify_all()
            return self._version

    def delete(self, name: str, namespace: str = "inference") -> None:
        with self._lock:
            self._version += 1
            obj = copy.deepcopy(self._slices.pop((namespace, name)))
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._events.append(_Event(self._version, "DELETED", obj))
            self._lock.notify_all()

    def bookmark(self) -> None:
        """Tell open watches (that asked for bookmarks) the current version."""
        with self._lock:
            self._events.append(_Event(self._version, "BOOKMARK", {}))
            self._lock.notify_all()

    def expire(self) -> None:
        """Forget the history: a watch resuming from any version seen so far gets 410."""
        with self._lock:
            self._version += 1
            self._oldest = self._version
            self._lock.notify_all()

    def end_watches(self) -> None:
        """End every open watch (as the server does at its timeout); clients resume from their version."""
        with self._lock:
            self._watch_generation += 1
            self._lock.notify_all()

    def fail_with(self, status: int | None) -> None:
        """Answer every request with `status` (None: serve again); open watches end."""
        with self._lock:
            self.failure = status
        if status is not None:
            self.end_watches()

    def watches_started(self) -> int:
        return sum(1 for kind, _ in self.requests if kind == "watch")

    def lists_served(self) -> int:
        return sum(1 for kind, _ in self.requests if kind == "list")

    # --- serving ------------------------------------------------------------------------------------------

    def _matching(self, namespace: str, service: str | None, obj: dict[str, Any]) -> bool:
        metadata = obj.get("metadata", {})
        if metadata.get("namespace") != namespace:
            return False
        return service is None or metadata.get("labels", {}).get(SERVICE_LABEL) == service

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> dict[str, Any]:
                return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                        "reason": reason, "code": code}  # fmt: skip

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                api.authorizations.append(self.headers.get("Authorization"))
                parts = url.path.removeprefix(PREFIX).split("/")
                if not url.path.startswith(PREFIX) or len(parts) != 2 or parts[1] != "endpointslices":
                    self._json(404, self._status(404, "NotFound", f"no such path {url.path}"))
                    return
                namespace = parts[0]
                selector = query.get("labelSelector", "")
                service = selector.removeprefix(f"{SERVICE_LABEL}=") if selector else None
                watch = query.get("watch") in ("1", "true")
                api.requests.append(("watch" if watch else "list", query.get("resourceVersion")))
                if api.failure is not None:
                    self._json(
                        api.failure, self._status(api.failure, "InternalError", "the fake API is failing")
                    )
                    return
                if not watch:
                    with api._lock:
                        items = [
                            copy.deepcopy(o)
                            for o in api._slices.values()
                            if api._matching(namespace, service, o)
                        ]
                        version = str(api._version)
                    self._json(200, {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                     "metadata": {"resourceVersion": version}, "items": items})  # fmt: skip
                    return
                self._watch(namespace, service, query)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _send_event(self, kind: str, obj: dict[str, Any]) -> None:
                line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                if api.split_events:
                    half = len(line) // 2
                    self._chunk(line[:half])
                    self._chunk(line[half:])
                else:
                    self._chunk(line)

            def _watch(self, namespace: str, service: str | None, query: dict[str, str]) -> None:
                since = int(query.get("resourceVersion") or 0)
                bookmarks = query.get("allowWatchBookmarks") == "true"
                deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
                with api._lock:
                    too_old = since < api._oldest
                    generation = api._watch_generation
                    position = 0
                    while position < len(api._events) and api._events[position].version <= since:
                        position += 1
                if too_old and api.gone_as_status:
                    self._json(410, self._status(410, "Gone", f"too old resource version: {since}"))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if too_old:
                    message = f"too old resource version: {since} ({api._oldest})"
                    self._send_event("ERROR", self._status(410, "Expired", message))
                    self._chunk(b"")
                    return
                with api._lock:
                    api.open_watches += 1
                try:
                    while True:
                        with api._lock:
                            while (
                                position >= len(api._events)
                                and generation == api._watch_generation
                                and not api._stopping
                                and time.monotonic() < deadline
                            ):
                                api._lock.wait(0.05)
                            if (
                                generation != api._watch_generation
                                or api._stopping
                                or time.monotonic() >= deadline
                            ):
                                break
                            event = api._events[position]
                            position += 1
                        if event.kind == "BOOKMARK":
                            if bookmarks:
                                obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                       "metadata": {"resourceVersion": str(event.version)}}  # fmt: skip
                                self._send_event("BOOKMARK", obj)
                        elif api._matching(namespace, service, event.obj):
                            self._send_event(event.kind, event.obj)
                    self._chunk(b"")
                except OSError:
                    pass  # the client went away
                finally:
                    with api._lock:
                        api.open_watches -= 1

        return Handler
