"""The metrics HTTP server: `GET /metrics` (Prometheus text) and `GET /engines` (JSON), on its own
thread (stdlib `http.server`), so a scrape never waits on the control plane's event loop and the event
loop never waits on a scrape. The data plane's text is rendered in Rust with the GIL released.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from extproc import _native, metrics
from extproc.pool import EnginePool

log = structlog.get_logger("extproc.metrics")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, tuple[str, Callable[[], bytes]]]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        route = self.server.routes.get(path)
        if route is None:
            self._reply(404, "text/plain", b"not found: try /metrics or /engines\n")
            return
        content_type, body = route
        self._reply(200, content_type, body())

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


class MetricsServer:
    """Serves `/metrics` and `/engines` of one running gateway until `stop`."""

    def __init__(
        self, gateway: _native.Gateway, pools: Mapping[str, EnginePool], host: str, port: int
    ) -> None:
        """Binds `host:port` (port 0: any free port); OSError when it cannot."""
        self._http = _Server((host, port), _Handler)
        self._http.routes = {
            "/metrics": (metrics.CONTENT_TYPE, lambda: metrics.render(gateway, pools).encode()),
            "/engines": (
                "application/json",
                lambda: json.dumps(metrics.engine_view(gateway, pools)).encode(),
            ),
        }
        self._thread = threading.Thread(target=self._http.serve_forever, name="extproc-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
