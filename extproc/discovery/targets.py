"""What an entry of `engines` names: one engine at a fixed address, every address of a DNS name, or the
endpoints of a Kubernetes Service. Parsed once at configuration time; each form has one written shape.

    grpc://10.0.0.7:8001              StaticTarget    one engine
    grpc://[fd00::7]:8001             StaticTarget
    grpc://localhost:8001             StaticTarget    127.0.0.1 (as always)
    grpc://vllm.ns.svc:8001           DnsTarget       every A/AAAA address, each an engine
    k8s://ns/vllm:grpc                ServiceTarget   the Service's EndpointSlices, port named "grpc"
    k8s://vllm                        ServiceTarget   extproc's own namespace, the slices' port
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

GRPC = "grpc://"
K8S = "k8s://"

# A DNS-1123 label (namespaces, Service names, port names are labels; port names at most 15 characters).
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_K8S = re.compile(rf"(?:(?P<ns>{_LABEL})/)?(?P<svc>{_LABEL})(?::(?P<port>[a-z0-9-]{{1,15}}))?")


@dataclass(frozen=True)
class StaticTarget:
    """One engine at a fixed `ip:port` (`[v6]:port`)."""

    address: str


@dataclass(frozen=True)
class DnsTarget:
    """Every address `name` resolves to, on `port`."""

    name: str
    port: int


@dataclass(frozen=True)
class ServiceTarget:
    """The ready endpoints of a Kubernetes Service. `namespace` None: extproc's own; `port`: a port name,
    a port number, or None for the slices' port (their only one, else the one named "grpc")."""

    namespace: str | None
    service: str
    port: str | int | None


Target = StaticTarget | DnsTarget | ServiceTarget

EXPECTED = "expected grpc://IP:port, grpc://dns-name:port or k8s://[namespace/]service[:port]"


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(EXPECTED)
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1], int(port)
    if ":" in host:  # an IPv6 literal needs brackets: "::1:50051" is ambiguous
        raise ValueError(EXPECTED)
    return host, int(port)


def parse_target(url: str) -> Target:
    """The target an engine URL names; ValueError with the expected forms otherwise."""
    text = url.strip()
    if text.startswith(K8S):
        match = _K8S.fullmatch(text.removeprefix(K8S).rstrip("/"))
        if not match:
            raise ValueError(EXPECTED)
        port: str | int | None = match["port"]
        if isinstance(port, str) and port.isdigit():
            port = int(port)
            if not 0 < port < 65536:
                raise ValueError(EXPECTED)
        return ServiceTarget(match["ns"], match["svc"], port)
    if not text.startswith(GRPC):
        raise ValueError(EXPECTED)
    host, port_number = _host_port(text.removeprefix(GRPC).rstrip("/"))
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().removesuffix(".")
        if not _DNS_NAME.fullmatch(name):
            raise ValueError(EXPECTED) from None
        return DnsTarget(name, port_number)
    return StaticTarget(address_of(str(ip), port_number))


def address_of(ip: str, port: int) -> str:
    """`ip:port`, `[v6]:port` (what Envoy's destination header carries)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def target_url(target: Target) -> str:
    """The one written form of a target."""
    if isinstance(target, StaticTarget):
        return GRPC + target.address
    if isinstance(target, DnsTarget):
        return f"{GRPC}{target.name}:{target.port}"
    namespace = f"{target.namespace}/" if target.namespace else ""
    port = "" if target.port is None else f":{target.port}"
    return f"{K8S}{namespace}{target.service}{port}"


def is_static(url: str) -> bool:
    """Whether the URL names one engine at a fixed address (what Envoy's static engine list can hold)."""
    try:
        return isinstance(parse_target(url), StaticTarget)
    except ValueError:
        return False
