"""Reading Kubernetes EndpointSlices (discovery.k8s.io/v1): which engine addresses a slice lists, on which
port, and whether each may take new requests.

One endpoint is one pod; of its `addresses` the first is used (the API calls them fungible). An endpoint
takes new requests when its conditions say ready (absent: ready, as the API asks consumers to assume) and
not terminating (absent: not terminating); otherwise it is kept but draining: its open requests finish,
new ones go elsewhere. The port is chosen by name or number among the slice's `ports` (which are the
pods' ports, named after the Service's); without one, the slice's only port, else the one named "grpc".
FQDN slices name no address Envoy can connect to by IP and are skipped.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extproc.discovery.targets import address_of

DEFAULT_PORT_NAME = "grpc"


@dataclass(frozen=True)
class SliceEngines:
    """What one slice contributes: ready-or-draining by engine address, or why it contributes nothing."""

    ready: Mapping[str, bool]
    problem: str | None = None


def slice_port(ports: Any, wanted: str | int | None) -> int | str:
    """The port number to use from a slice's `ports`, or the problem (a str) when there is none."""
    usable = [p for p in ports or () if isinstance(p, Mapping) and isinstance(p.get("port"), int)]
    if isinstance(wanted, int):
        # A slice without ports lists endpoints with no port defined: the number given is then the one.
        if not usable or any(p["port"] == wanted for p in usable):
            return wanted
        return f"no port {wanted} among {sorted(p['port'] for p in usable)}"
    if wanted is not None:
        for p in usable:
            if p.get("name") == wanted:
                return int(p["port"])
        return f"no port named {wanted!r} among {sorted(str(p.get('name') or '') for p in usable)}"
    if len(usable) == 1:
        return int(usable[0]["port"])
    for p in usable:
        if p.get("name") == DEFAULT_PORT_NAME:
            return int(p["port"])
    if not usable:
        return "no ports: name the port number in the k8s:// URL"
    return f"several ports and none named {DEFAULT_PORT_NAME!r}: name one in the k8s:// URL"


def _takes_requests(conditions: Any) -> bool:
    if not isinstance(conditions, Mapping):
        return True
    return conditions.get("ready") is not False and conditions.get("terminating") is not True


def slice_engines(endpoint_slice: Mapping[str, Any], wanted_port: str | int | None) -> SliceEngines:
    """The engines one EndpointSlice object lists."""
    address_type = endpoint_slice.get("addressType")
    if address_type not in ("IPv4", "IPv6"):
        return SliceEngines({}, f"address type {address_type!r}: only IPv4 and IPv6 slices name engines")
    port = slice_port(endpoint_slice.get("ports"), wanted_port)
    if isinstance(port, str):
        return SliceEngines({}, port)
    ready: dict[str, bool] = {}
    for endpoint in endpoint_slice.get("endpoints") or ():
        if not isinstance(endpoint, Mapping):
            continue
        addresses = endpoint.get("addresses") or ()
        if not addresses or not isinstance(addresses[0], str):
            continue
        try:
            ip = ipaddress.ip_address(addresses[0])
        except ValueError:
            continue
        address = address_of(str(ip), port)
        # The same pod in two slices (while it moves between them): ready if either says so.
        ready[address] = ready.get(address, False) or _takes_requests(endpoint.get("conditions"))
    return SliceEngines(ready)


def merge(parts: Iterable[Mapping[str, bool]]) -> dict[str, bool]:
    """Several slices' (or sources') engines as one set: an engine takes requests if any part says so."""
    merged: dict[str, bool] = {}
    for part in parts:
        for address, ready in part.items():
            merged[address] = merged.get(address, False) or ready
    return merged
