"""One served model's discovered engines: a watch per source (DNS names, Kubernetes Services), their sets
merged, the result handed to the model's engine pool whenever it changes.

The pool applies one merged set at a time (an applier task, latest set wins), so removing an engine
(closing its channel and KV-event subscription) never races with adding it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from extproc.discovery.dns import DnsWatch, Resolver, resolve_addresses
from extproc.discovery.kube_http import SERVICE_ACCOUNT_DIR, ApiServer
from extproc.discovery.kubernetes import EndpointSliceWatch
from extproc.discovery.targets import DnsTarget, ServiceTarget, parse_target
from extproc.setting_parsers import EngineConfig

log = structlog.get_logger("extproc.discovery")

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class DiscoveredEngine:
    """One engine a source found: its config (protocol, KV-event source) and whether it takes requests
    (False: draining or not ready: kept, open requests finish, no new ones)."""

    config: EngineConfig
    ready: bool


# The pool's side: apply the full set of discovered engines, by address.
Apply = Callable[[Mapping[str, DiscoveredEngine]], Awaitable[None]]


@dataclass(frozen=True)
class DiscoveryOptions:
    dns_refresh_interval_s: float = 5.0
    # The Kubernetes API; None: in-cluster (resolved only when a k8s:// engine needs it).
    kubernetes_api: str | None = None
    kubernetes_token_file: str | None = None
    kubernetes_ca_file: str | None = None
    # Tests inject a resolver; production resolves with the system's.
    resolve: Resolver = resolve_addresses

    def api_server(self) -> ApiServer:
        """Where k8s:// engines are watched; ApiUnavailable outside a cluster without kubernetes_api."""
        if self.kubernetes_api is None:
            server = ApiServer.in_cluster()
            token, ca = (
                self.kubernetes_token_file or server.token_file,
                self.kubernetes_ca_file or server.ca_file,
            )
            return ApiServer(server.url, token, ca)
        account_token, account_ca = ApiServer.account_files()
        https = self.kubernetes_api.startswith("https://")
        return ApiServer(
            self.kubernetes_api,
            self.kubernetes_token_file or (account_token if https else None),
            self.kubernetes_ca_file or (account_ca if https else None),
        )


def own_namespace(account_dir: Path = SERVICE_ACCOUNT_DIR) -> str:
    """The namespace this pod runs in (its service account's), else "default"."""
    with contextlib.suppress(OSError):
        namespace = (account_dir / "namespace").read_text().strip()
        if namespace:
            return namespace
    return os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


def is_discovered(config: EngineConfig) -> bool:
    """Whether the engine entry is a source found at run time (a DNS name, a Kubernetes Service)."""
    return isinstance(parse_target(config.url), (DnsTarget, ServiceTarget))


class ModelDiscovery:
    """Runs the watches of one model's discovered sources and applies their merged engines."""

    def __init__(
        self, model: str, sources: Sequence[EngineConfig], apply: Apply, options: DiscoveryOptions
    ) -> None:
        self.model = model
        self._apply = apply
        self._found: list[dict[str, bool]] = [{} for _ in sources]
        self._configs = list(sources)
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.watches: list[DnsWatch | EndpointSliceWatch] = []
        api: ApiServer | None = None
        for i, config in enumerate(sources):
            target = parse_target(config.url)
            on_change = self._on_change(i)
            if isinstance(target, DnsTarget):
                self.watches.append(
                    DnsWatch(
                        target.name, target.port, options.dns_refresh_interval_s, on_change, options.resolve
                    )
                )
            elif isinstance(target, ServiceTarget):
                api = api or options.api_server()
                namespace = target.namespace or own_namespace()
                self.watches.append(
                    EndpointSliceWatch(api, namespace, target.service, target.port, on_change)
                )
            else:
                raise ValueError(f"{config.url} is not discovered")

    def _on_change(self, index: int) -> Callable[[dict[str, bool]], None]:
        def changed(engines: dict[str, bool]) -> None:
            draining = sum(not ready for ready in engines.values())
            log.info("engines discovered", model=self.model, source=self.watches[index].source,
                     engines=len(engines), draining=draining)  # fmt: skip
            self._found[index] = engines
            self._changed.set()

        return changed

    def engines(self) -> dict[str, DiscoveredEngine]:
        """Every source's engines merged: an address two sources name takes requests if either says so."""
        merged: dict[str, DiscoveredEngine] = {}
        for config, found in zip(self._configs, self._found, strict=True):
            for address, ready in found.items():
                known = merged.get(address)
                if known is not None:
                    merged[address] = DiscoveredEngine(known.config, known.ready or ready)
                else:
                    merged[address] = DiscoveredEngine(config, ready)
        return merged

    def start(self) -> None:
        self._tasks = [asyncio.create_task(w.run(), name=f"discovery {w.source}") for w in self.watches]
        self._tasks.append(asyncio.create_task(self._applier(), name=f"discovery {self.model}"))

    async def _applier(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._apply(self.engines())
            except Exception:  # one failed application must not end discovery; the next change retries
                log.exception("applying discovered engines failed", model=self.model)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
