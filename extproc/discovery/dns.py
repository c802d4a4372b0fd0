"""Engines behind a DNS name: every A/AAAA address it resolves to is an engine on the given port,
resolved again every interval (a headless Kubernetes Service, a round-robin record). Addresses that appear
are added, those that disappear removed; a failed resolution keeps the last known set.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import structlog

from extproc.discovery.targets import address_of

log = structlog.get_logger("extproc.discovery")

RESOLVE_TIMEOUT_S = 5.0

# name, port -> the IP addresses (text) it resolves to; raises OSError when it does not.
Resolver = Callable[[str, int], Awaitable[list[str]]]
OnChange = Callable[[dict[str, bool]], None]


async def resolve_addresses(name: str, port: int) -> list[str]:
    """Every IPv4 and IPv6 address of `name`, in the resolver's order, each once."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            ip = str(sockaddr[0]).split("%")[0]  # no zone index: Envoy's header takes a plain address
            if ip not in addresses:
                addresses.append(ip)
    return addresses


class DnsWatch:
    """Resolves `name` every `interval_s`; calls `on_change` (every address ready) when the set changes."""

    def __init__(
        self,
        name: str,
        port: int,
        interval_s: float,
        on_change: OnChange,
        resolve: Resolver = resolve_addresses,
    ) -> None:
        self.name = name
        self.port = port
        self.interval_s = interval_s
        self._on_change = on_change
        self._resolve = resolve
        self._engines: dict[str, bool] | None = None

    @property
    def source(self) -> str:
        return f"grpc://{self.name}:{self.port}"

    async def run(self) -> None:
        last_error: str | None = None
        while True:
            try:
                ips = await asyncio.wait_for(self._resolve(self.name, self.port), RESOLVE_TIMEOUT_S)
                engines = {address_of(ip, self.port): True for ip in ips}
                last_error = None
                if engines != self._engines:
                    self._engines = engines
                    self._on_change(dict(engines))
            except (OSError, TimeoutError) as e:
                error = str(e) or type(e).__name__
                if error != last_error:
                    log.warning("cannot resolve engines; keeping the engines known", source=self.source,
                                error=error, engines=len(self._engines or {}))  # fmt: skip
                    last_error = error
            await asyncio.sleep(self.interval_s)
