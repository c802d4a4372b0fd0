"""A Kubernetes Service's engines, kept current by listing and watching its EndpointSlices.

    GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=kubernetes.io/service-name=SVC
    GET ...&watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=N

The list gives every slice and a resourceVersion; the watch then streams ADDED/MODIFIED/DELETED events from
it (and BOOKMARKs that only move the resourceVersion on). When a watch ends (the server's timeout) it is
resumed from the last resourceVersion seen; when the API says that version is gone (410, as a status or
an ERROR event) everything is listed again. On any other failure the last known engines stay as they are
and the watch is retried with exponential backoff: an unreachable API never empties a model.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from extproc.discovery.endpointslices import merge, slice_engines
from extproc.discovery.kube_http import ApiServer, ApiUnavailable, HttpStatus, Response

log = structlog.get_logger("extproc.discovery")

SERVICE_LABEL = "kubernetes.io/service-name"
WATCH_TIMEOUT_S = 300
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
# A watch quiet for longer than its own timeout plus this is a dead connection.
WATCH_SLACK_S = 30.0

OnChange = Callable[[dict[str, bool]], None]


class Gone(Exception):
    """The resourceVersion is too old for the API to resume from: list again."""


def slices_path(namespace: str, service: str) -> str:
    selector = urllib.parse.quote(f"{SERVICE_LABEL}={service}", safe="")
    return f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={selector}"


def _resource_version(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
    return version if isinstance(version, str) and version else None


def _name(obj: Any) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else None


class EndpointSliceWatch:
    """Follows one Service's EndpointSlices; calls `on_change` with ready-or-draining by engine address
    whenever that set changes."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        service: str,
        port: str | int | None,
        on_change: OnChange,
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.service = service
        self.port = port
        self._on_change = on_change
        self._watch_timeout_s = watch_timeout_s
        self._backoff_max_s = backoff_max_s
        self._path = slices_path(namespace, service)
        self._slices: dict[str, dict[str, bool]] = {}
        self._problems: dict[str, str] = {}
        self._engines: dict[str, bool] | None = None
        self.resource_version: str | None = None
        # Lists made (the first and every one after a 410): for tests and logs.
        self.lists = 0

    @property
    def source(self) -> str:
        return f"k8s://{self.namespace}/{self.service}"

    async def run(self) -> None:
        """List, then watch, forever (until cancelled)."""
        failures = 0
        last_error: str | None = None
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                started = asyncio.get_running_loop().time()
                await self._watch()
                failures = 0
                if asyncio.get_running_loop().time() - started < BACKOFF_FIRST_S:
                    await asyncio.sleep(
                        BACKOFF_FIRST_S
                    )  # a server that ends watches at once is not polled hot
            except Gone:
                log.info("endpointslice watch expired; listing again", source=self.source)
                self.resource_version = None
            except (
                ApiUnavailable,
                HttpStatus,
                OSError,
                TimeoutError,
                ValueError,
                asyncio.IncompleteReadError,
            ) as e:
                error = str(e) or type(e).__name__
                if error != last_error:
                    engines = len(self._engines or {})
                    log.warning("kubernetes API unavailable; keeping the engines known", source=self.source,
                                error=error, engines=engines)  # fmt: skip
                    last_error = error
                delay = min(self._backoff_max_s, BACKOFF_FIRST_S * 2**failures)
                failures += 1
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                continue
            last_error = None

    async def _get(self, query: str) -> Response:
        response = await self.api.get(self._path + query)
        if response.status == 200:
            return response
        error = await response.error()
        response.close()
        if response.status == 410:
            raise Gone()
        raise error

    async def _list(self) -> None:
        response = await self._get("")
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that lands as the
            # read completes, and `run` then watches on after its task was cancelled.
            async with asyncio.timeout(WATCH_SLACK_S):
                listing = await response.json()
        finally:
            response.close()
        if not isinstance(listing, Mapping) or not isinstance(listing.get("items"), list):
            raise ValueError("the EndpointSlice list has no items")
        self.lists += 1
        self._slices.clear()
        for item in listing["items"]:
            self._put(item)
        self.resource_version = _resource_version(listing)
        self._publish()

    async def _watch(self) -> None:
        query = f"&watch=1&allowWatchBookmarks=true&timeoutSeconds={self._watch_timeout_s}"
        query += f"&resourceVersion={urllib.parse.quote(self.resource_version or '')}"
        response = await self._get(query)
        try:
            lines = response.lines()
            while True:
                try:
                    async with asyncio.timeout(self._watch_timeout_s + WATCH_SLACK_S):
                        line = await anext(lines)
                except StopAsyncIteration:
                    return  # the server ended the watch: resume from the last version
                self._event(json.loads(line))
        finally:
            response.close()

    def _event(self, event: Any) -> None:
        if not isinstance(event, Mapping):
            raise ValueError("a watch event that is not an object")
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code == 410:
                raise Gone()
            message = obj.get("message") if isinstance(obj, Mapping) else obj
            raise HttpStatus(code if isinstance(code, int) else 500, str(message))
        version = _resource_version(obj)
        if kind in ("ADDED", "MODIFIED"):
            self._put(obj)
        elif kind == "DELETED":
            name = _name(obj)
            if name is not None:
                self._slices.pop(name, None)
                self._problems.pop(name, None)
        elif kind != "BOOKMARK":
            return
        if version is not None:
            self.resource_version = version
        if kind != "BOOKMARK":
            self._publish()

    def _put(self, obj: Any) -> None:
        name = _name(obj)
        if name is None or not isinstance(obj, Mapping):
            return
        found = slice_engines(obj, self.port)
        self._slices[name] = dict(found.ready)
        if found.problem is not None and self._problems.get(name) != found.problem:
            log.warning(
                "endpointslice names no engines", source=self.source, slice=name, reason=found.problem
            )
        if found.problem is None:
            self._problems.pop(name, None)
        else:
            self._problems[name] = found.problem

    def _publish(self) -> None:
        engines = merge(self._slices.values())
        if engines != self._engines:
            self._engines = engines
            self._on_change(dict(engines))
