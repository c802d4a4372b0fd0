"""What an Istio ingress gateway's Envoy would be given for deploy/istio, as a static bootstrap: the
listener with the VirtualService's routes, the cluster Istio builds for the extproc Service and the one
for the engines' ServiceEntry (with the DestinationRule's HTTP/2, no TLS), and the EnvoyFilter's patches
applied as Istio applies them (MERGE: protobuf merge; INSERT_BEFORE: before the named filter).

It translates only the VirtualService and ServiceEntry fields deploy/istio uses and refuses others, so a
manifest change it cannot express fails the tests rather than being ignored. Used to validate the
patches with `envoy --mode validate` and to run the routing for real against extproc and simulated
engines (tests/deploy/test_istio_routing.py).
"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass
from typing import Any

_TYPE = "type.googleapis.com/"
_HCM = "envoy.filters.network.http_connection_manager"
_ROUTER = "envoy.filters.http.router"


@dataclass(frozen=True)
class GatewayAddresses:
    """Where the bootstrap's pieces live: the real gateway's, or loopback ports for a local run."""

    listen_host: str = "0.0.0.0"
    listen_port: int = 8080
    admin_port: int | None = None
    # The extproc Service's address as the cluster reaches it (Istio: its endpoints, by EDS).
    extproc_host: str = "extproc.llm-gateway.svc.cluster.local"
    extproc_port: int = 50051


def proto_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Istio's MERGE: protobuf merge semantics (messages merged field by field, repeated fields appended)."""
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = proto_merge(merged[key], value)
        elif isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = merged[key] + copy.deepcopy(value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == kind]
    return found


def _cluster_name(host: str, port: int) -> str:
    return f"outbound|{port}||{host}"


def _string_match(match: dict[str, str]) -> dict[str, Any]:
    [(kind, value)] = match.items()
    return {
        "exact": {"exact": value},
        "prefix": {"prefix": value},
        "regex": {"safe_regex": {"regex": value}},
    }[kind]


def _route(http: dict[str, Any]) -> list[dict[str, Any]]:
    """One VirtualService HTTP route as Envoy routes (one per match; no match: everything)."""
    known = {"name", "match", "route", "directResponse", "retries"}
    if set(http) - known:
        raise ValueError(f"VirtualService fields this translation does not know: {sorted(set(http) - known)}")
    action: dict[str, Any]
    if "directResponse" in http:
        direct = http["directResponse"]
        action = {"direct_response": {"status": direct["status"]}}
        if "body" in direct:
            action["direct_response"]["body"] = {"inline_string": direct["body"]["string"]}
    else:
        [destination] = [r["destination"] for r in http["route"]]
        # Istio's default route timeout is off; retries as the VirtualService says (attempts 0: none).
        action = {
            "route": {
                "cluster": _cluster_name(destination["host"], destination["port"]["number"]),
                "timeout": "0s",
            }
        }
        if http.get("retries", {}).get("attempts", 2) > 0:
            raise ValueError("only `retries: {attempts: 0}` is translated")
    routes = []
    for match in http.get("match") or [{}]:
        if set(match) - {"headers"}:
            raise ValueError(
                f"match fields this translation does not know: {sorted(set(match) - {'headers'})}"
            )
        envoy_match: dict[str, Any] = {"prefix": "/"}
        headers = [
            {"name": name, "string_match": _string_match(m)} for name, m in match.get("headers", {}).items()
        ]
        if headers:
            envoy_match["headers"] = headers
        routes.append({"match": envoy_match, **action})
    return routes


def _h2_options() -> dict[str, Any]:
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    return {key: {"@type": _TYPE + key, "explicit_http_config": {"http2_protocol_options": {}}}}


def _engines_cluster(entry: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """The cluster Istio builds for a `resolution: NONE` ServiceEntry: ORIGINAL_DST; HTTP/2 for a GRPC
    port or `h2UpgradePolicy: UPGRADE`; plaintext with `tls.mode: DISABLE`."""
    spec = entry["spec"]
    if spec["resolution"] != "NONE":
        raise ValueError("only resolution NONE (ORIGINAL_DST) is translated")
    [port] = spec["ports"]
    policy = rule["spec"]["trafficPolicy"]
    assert rule["spec"]["host"] == spec["hosts"][0]
    assert policy["tls"]["mode"] == "DISABLE"
    cluster: dict[str, Any] = {
        "name": _cluster_name(spec["hosts"][0], port["number"]),
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
    }
    if port["protocol"] == "GRPC" or policy["connectionPool"]["http"]["h2UpgradePolicy"] == "UPGRADE":
        cluster["typed_extension_protocol_options"] = _h2_options()
    return cluster


def _insert_before(filters: list[dict[str, Any]], name: str, value: dict[str, Any]) -> list[dict[str, Any]]:
    index = next(i for i, f in enumerate(filters) if f["name"] == name)
    return [*filters[:index], copy.deepcopy(value), *filters[index:]]


def bootstrap(objs: list[dict[str, Any]], at: GatewayAddresses = GatewayAddresses()) -> dict[str, Any]:
    """The gateway's Envoy configuration for the rendered deploy/istio objects."""
    envoy_filter = _one(objs, "EnvoyFilter")
    service = _one(objs, "VirtualService")
    entry = _one(objs, "ServiceEntry")
    rule = _one(objs, "DestinationRule")
    routes = [r for http in service["spec"]["http"] for r in _route(http)]
    hcm: dict[str, Any] = {
        "@type": _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": f"outbound_0.0.0.0_{at.listen_port}",
        "route_config": {
            "name": "http.80",
            "virtual_hosts": [{"name": "*:80", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {
                "name": _ROUTER,
                "typed_config": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    clusters = [_engines_cluster(entry, rule)]
    for patch in envoy_filter["spec"]["configPatches"]:
        operation, value = patch["patch"]["operation"], patch["patch"]["value"]
        if patch["match"]["context"] != "GATEWAY":
            raise ValueError("only GATEWAY patches are translated")
        if patch["applyTo"] == "NETWORK_FILTER" and operation == "MERGE":
            assert patch["match"]["listener"]["filterChain"]["filter"]["name"] == _HCM
            hcm = proto_merge(hcm, value["typed_config"])
        elif patch["applyTo"] == "HTTP_FILTER" and operation == "INSERT_BEFORE":
            before = patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            hcm["http_filters"] = _insert_before(hcm["http_filters"], before, value)
        elif patch["applyTo"] == "CLUSTER" and operation == "MERGE":
            match = patch["match"]["cluster"]
            name = _cluster_name(match["service"], match["portNumber"])
            [index] = [i for i, c in enumerate(clusters) if c["name"] == name]
            clusters[index] = proto_merge(clusters[index], value)
        else:
            raise ValueError(f"patch not translated: {patch['applyTo']} {operation}")
    # The cluster the ext_proc filter names: Istio's for the extproc Service's gRPC port (HTTP/2).
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    extproc_name = ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    address = {"socket_address": {"address": at.extproc_host, "port_value": at.extproc_port}}
    clusters.insert(
        0,
        {
            "name": extproc_name,
            "type": "STATIC" if _is_ip(at.extproc_host) else "STRICT_DNS",
            "connect_timeout": "10s",
            "typed_extension_protocol_options": _h2_options(),
            "load_assignment": {
                "cluster_name": extproc_name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
            },
        },
    )
    config: dict[str, Any] = {
        "static_resources": {
            "listeners": [
                {
                    "name": f"0.0.0.0_{at.listen_port}",
                    "address": {"socket_address": {"address": at.listen_host, "port_value": at.listen_port}},
                    "filter_chains": [{"filters": [{"name": _HCM, "typed_config": hcm}]}],
                }
            ],
            "clusters": clusters,
        }
    }
    if at.admin_port is not None:
        config["admin"] = {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": at.admin_port}}
        }
    return config
