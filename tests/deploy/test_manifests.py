"""The manifests under deploy/: every object of every kustomization validates against the Kubernetes
schemas (kubernetes-validate, strict: unknown fields fail) or, for CRD kinds, against the schemas in
tests/deploy/schemas/ (written from the published API references); and the objects fit together the way
a cluster would need them to (selectors, ports, names, probes, permissions). No cluster, no network."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.kustomize import kustomizations, listed_files, render

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMAS = Path(__file__).parent / "schemas"
# The oldest Kubernetes the manifests are for: gRPC probes (GA 1.27) and the preStop `sleep` action
# (beta, on by default, 1.30).
KUBERNETES_VERSION = "1.30"
NAMESPACE = "llm-gateway"
# Where the kustomizations the docs tell operators to apply live, and the kinds each must produce.
ENTRY_POINTS = {
    "kubernetes/overlays/vllm": {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Role"},
    "kubernetes/overlays/sglang": {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Role"},
    "istio": {"EnvoyFilter", "DestinationRule", "ServiceEntry", "VirtualService", "Gateway"},
    "gie": {"InferencePool", "HTTPRoute", "Gateway"},
}
KUSTOMIZATIONS = [path.relative_to(DEPLOY).as_posix() for path in kustomizations(DEPLOY)]
# What an operator applies: complete sets of objects that must fit together.
APPLIED = sorted(ENTRY_POINTS)


@cache
def objects(kustomization: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(DEPLOY / kustomization))


def _named(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _crd_schema(obj: dict[str, Any]) -> dict[str, Any] | None:
    group, _, version = obj["apiVersion"].rpartition("/")
    path = SCHEMAS / f"{obj['kind'].lower()}-{group}-{version}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _pod_specs(objs: tuple[dict[str, Any], ...]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, o["spec"]["template"]) for o in objs if o["kind"] == "Deployment"]


# --- every object is valid -----------------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_validates_against_its_schema(kustomization: str) -> None:
    objs = objects(kustomization)
    assert objs, f"{kustomization} renders no objects"
    for obj in objs:
        schema = _crd_schema(obj)
        where = f"{kustomization}: {obj['kind']} {obj['metadata'].get('name')}"
        if schema is not None:
            try:
                jsonschema.Draft202012Validator(schema).validate(obj)
            except jsonschema.ValidationError as e:
                pytest.fail(f"{where}: {e.message} at {'/'.join(map(str, e.absolute_path))}")
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: neither a Kubernetes kind nor one with a schema in {SCHEMAS}")
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {e}")


@pytest.mark.parametrize("schema", sorted(p.name for p in SCHEMAS.glob("*.json")))
def test_crd_schemas_are_valid_and_used_and_refuse_what_the_api_refuses(schema: str) -> None:
    """Each schema is a valid JSON Schema, some manifest is checked by it, and that manifest with its
    spec missing, or with an unknown spec field, is refused."""
    document = json.loads((SCHEMAS / schema).read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    users = [o for k in APPLIED for o in objects(k) if _crd_schema(o) == document]
    assert users, f"no manifest is a {document['title']}"
    validator = jsonschema.Draft202012Validator(document)
    obj = users[0]
    assert validator.is_valid(obj)
    assert not validator.is_valid({key: value for key, value in obj.items() if key != "spec"})
    assert not validator.is_valid({**obj, "spec": {**obj["spec"], "noSuchField": 1}})


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_objects_live_in_the_gateway_namespace(kustomization: str) -> None:
    for obj in objects(kustomization):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == NAMESPACE
        elif obj["kind"] == "EnvoyFilter":
            # Istio's root namespace: the only one whose EnvoyFilters may select the ingress gateway there.
            assert namespace == "istio-system"
        else:
            assert namespace == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']}: namespace {namespace}"


@pytest.mark.parametrize("entry, kinds", sorted(ENTRY_POINTS.items()))
def test_entry_points_produce_what_the_docs_promise(entry: str, kinds: set[str]) -> None:
    assert kinds <= {o["kind"] for o in objects(entry)}


def _is_kubernetes_manifest(path: Path) -> bool:
    """A YAML file of Kubernetes objects (not an Envoy config, which test_envoy_configs.py checks)."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return bool(documents) and all(
        isinstance(d, dict) and "apiVersion" in d and "kind" in d for d in documents
    )


def test_every_manifest_file_is_part_of_a_kustomization() -> None:
    """A file of Kubernetes objects no kustomization lists would be neither applied nor validated."""
    listed = set().union(*(listed_files(DEPLOY / k) for k in KUSTOMIZATIONS))
    manifests = {
        p.resolve() for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and _is_kubernetes_manifest(p)
    }
    assert manifests, "no manifests found"
    assert sorted(map(str, manifests - listed)) == []
    # The generators' inputs (extproc.toml, envoy.json) are listed too: they exist, and nothing else is.
    assert all(p.is_file() for p in listed)


def test_the_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    from tests.deploy.kustomize import KustomizeError

    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamespace: elsewhere\n")
    with pytest.raises(KustomizeError, match="namespace"):
        render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (its built-in kustomize)")
@pytest.mark.parametrize("kustomization", APPLIED)
def test_the_renderer_agrees_with_kubectl_kustomize(kustomization: str) -> None:
    """Where kubectl is installed, its kustomize renders exactly the objects these tests check."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    theirs = sorted(json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(out) if d)
    ours = sorted(json.dumps(d, sort_keys=True) for d in objects(kustomization))
    assert ours == theirs


# --- the objects fit together ---------------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", APPLIED)
def test_services_select_pods_and_name_their_ports(kustomization: str) -> None:
    objs = objects(kustomization)
    pods = [template for _, template in _pod_specs(objs)]
    for service in (o for o in objs if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matching = [p for p in pods if selector.items() <= p["metadata"]["labels"].items()]
        assert matching, f"Service {service['metadata']['name']} selects no pod template"
        for port in service["spec"]["ports"]:
            names = {p["name"] for pod in matching for c in pod["spec"]["containers"] for p in c["ports"]}
            assert port["targetPort"] in names, f"{service['metadata']['name']}: no container port {port}"


@pytest.mark.parametrize("kustomization", APPLIED)
def test_disruption_budgets_cover_deployments(kustomization: str) -> None:
    objs = objects(kustomization)
    for pdb in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
        labels = pdb["spec"]["selector"]["matchLabels"]
        covered = [d for d, t in _pod_specs(objs) if labels.items() <= t["metadata"]["labels"].items()]
        assert len(covered) == 1 and covered[0]["spec"]["replicas"] >= 2


@pytest.mark.parametrize("kustomization", APPLIED)
def test_volumes_refer_to_objects_that_exist(kustomization: str) -> None:
    objs = objects(kustomization)
    config_maps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    claims = {o["metadata"]["name"] for o in objs if o["kind"] == "PersistentVolumeClaim"}
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    for deployment, template in _pod_specs(objs):
        spec = template["spec"]
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        for source in (s for c in spec["containers"] for s in c.get("envFrom", [])):
            if not source["configMapRef"].get("optional"):
                assert source["configMapRef"]["name"] in config_maps
        mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert mounted <= {v["name"] for v in spec.get("volumes", [])}
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts, deployment["metadata"]["name"]


def _extproc(kustomization: str) -> dict[str, Any]:
    return _named(objects(kustomization), "Deployment", "extproc")["spec"]["template"]["spec"]


@pytest.mark.parametrize("kustomization", ["kubernetes/base", "istio", "gie"])
def test_extproc_probes_its_grpc_health_services(kustomization: str) -> None:
    container = _extproc(kustomization)["containers"][0]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    assert container["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}
    assert container["startupProbe"]["grpc"] == {"port": port, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": "readiness"}
    config = tomllib.loads(
        _named(objects(kustomization), "ConfigMap", "extproc-config")["data"]["extproc.toml"]
    )
    assert config["listen"] == f"0.0.0.0:{port}"


@pytest.mark.parametrize("kustomization", ["kubernetes/base"])
@pytest.mark.parametrize("deployment", ["extproc", "gateway"])
def test_gateway_pods_run_unprivileged_on_a_read_only_root(kustomization: str, deployment: str) -> None:
    spec = _named(objects(kustomization), "Deployment", deployment)["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "memory" in container["resources"]["limits"] and "cpu" in container["resources"]["requests"]
        # What is writable is an emptyDir: /tmp, and extproc's cache directory.
        writable = {m["mountPath"]: m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert "/tmp" in writable
        assert all("emptyDir" in volumes[name] for name in writable.values())
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        if "EXTPROC_CACHE_DIR" in env:
            assert env["EXTPROC_CACHE_DIR"] in writable


def test_extproc_may_only_watch_endpointslices() -> None:
    objs = objects("kubernetes/base")
    role = _named(objs, "Role", "extproc-endpointslices")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = _named(objs, "RoleBinding", "extproc-endpointslices")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "extproc", "namespace": NAMESPACE}]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    # Only extproc talks to the Kubernetes API.
    for deployment, template in _pod_specs(objs):
        if deployment["metadata"]["name"] != "extproc":
            assert template["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    "overlay, engine", [("kubernetes/overlays/vllm", "vllm"), ("kubernetes/overlays/sglang", "sglang")]
)
def test_extproc_discovers_the_overlays_engines(overlay: str, engine: str) -> None:
    """extproc's k8s:// engine source names a Service of the overlay, and a port of it speaking gRPC."""
    objs = objects(overlay)
    config = tomllib.loads(_named(objs, "ConfigMap", "extproc-config")["data"]["extproc.toml"])
    # No namespace: extproc's own, where the overlay puts the engines too.
    assert config["engines"] == [f"k8s://{engine}:grpc"]
    service = _named(objs, "Service", engine)
    port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert port["appProtocol"] == "grpc"
    # The engine's container serves the gRPC health service on that port (its probes say so).
    container = _named(objs, "Deployment", engine)["spec"]["template"]["spec"]["containers"][0]
    target = next(p["containerPort"] for p in container["ports"] if p["name"] == port["targetPort"])
    assert container["readinessProbe"]["grpc"]["port"] == target


@pytest.mark.parametrize("kustomization", ["istio", "gie"])
def test_one_destination_per_request_where_the_proxy_is_original_dst(kustomization: str) -> None:
    """Istio's and a GIE gateway's engine clusters here are ORIGINAL_DST: one address. extproc must list
    no fallbacks there (the base's EDS and fallback settings are not part of these)."""
    objs = objects(kustomization)
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "extproc-env"]
    config = tomllib.loads(_named(objs, "ConfigMap", "extproc-config")["data"]["extproc.toml"])
    assert config.get("destination_fallbacks", 0) == 0 and "xds_listen" not in config


def test_only_the_gateway_reaches_extprocs_grpc_ports() -> None:
    objs = objects("kubernetes/base")
    policy = _named(objs, "NetworkPolicy", "extproc")
    extproc = _named(objs, "Deployment", "extproc")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= extproc["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    gateway = _named(objs, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in extproc["spec"]["containers"][0]["ports"]}
    open_to: dict[str, list[Any]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["port"] in container_ports
            open_to.setdefault(port["port"], []).extend(rule.get("from", ["anyone"]))
    for name in ("grpc", "xds"):
        [peer] = open_to[name]
        assert peer["podSelector"]["matchLabels"].items() <= gateway.items()
    assert open_to["metrics"] == ["anyone"]


def test_drain_fits_in_the_termination_grace() -> None:
    """The kubelet kills extproc terminationGracePeriodSeconds after preStop began: keep it above preStop
    + shutdown_grace + 10 s (docs/operating.md, "Lifecycle"), or long streams are cut without aborts."""
    objs = objects("kubernetes/base")
    spec = _extproc("kubernetes/base")
    config = tomllib.loads(_named(objs, "ConfigMap", "extproc-config")["data"]["extproc.toml"])
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + config["shutdown_grace"] + 10


def test_inference_pool_picks_with_extproc() -> None:
    objs = objects("gie")
    pool = _named(objs, "InferencePool", "vllm")
    picker = pool["spec"]["endpointPickerRef"]
    service = _named(objs, "Service", picker["name"])
    assert picker.get("kind", "Service") == "Service" and picker.get("group", "") == ""
    assert picker["portNumber"] in {p["port"] for p in service["spec"]["ports"] if p["appProtocol"] == "grpc"}
    assert picker["failureMode"] == "FailClose"
    # The pool's pods are the engines, on their gRPC port.
    engines = [
        t
        for _, t in _pod_specs(objs)
        if pool["spec"]["selector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
    ]
    assert [t["metadata"]["labels"]["app.kubernetes.io/name"] for t in engines] == ["vllm"]
    ports = {p["containerPort"] for p in engines[0]["spec"]["containers"][0]["ports"]}
    assert pool["spec"]["targetPorts"][0]["number"] in ports
    route = _named(objs, "HTTPRoute", "openai")
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "vllm"}]
    gateway = _named(objs, "Gateway", route["spec"]["parentRefs"][0]["name"])
    assert route["spec"]["parentRefs"][0]["sectionName"] in {
        listener["name"] for listener in gateway["spec"]["listeners"]
    }


def test_istio_routes_picked_requests_to_the_engines_host() -> None:
    objs = objects("istio")
    entry = _named(objs, "ServiceEntry", "engines")
    rule = _named(objs, "DestinationRule", "engines")
    service = _named(objs, "VirtualService", "openai")
    host = entry["spec"]["hosts"][0]
    # ORIGINAL_DST (resolution NONE), gRPC over h2c.
    assert entry["spec"]["resolution"] == "NONE"
    assert [p["protocol"] for p in entry["spec"]["ports"]] == ["GRPC"]
    assert rule["spec"]["host"] == host
    assert rule["spec"]["trafficPolicy"]["connectionPool"]["http"]["h2UpgradePolicy"] == "UPGRADE"
    assert rule["spec"]["trafficPolicy"]["tls"]["mode"] == "DISABLE"
    picked, fallback = service["spec"]["http"]
    assert picked["match"] == [{"headers": {"x-gateway-destination-endpoint": {"regex": ".+"}}}]
    assert picked["route"][0]["destination"] == {
        "host": host,
        "port": {"number": entry["spec"]["ports"][0]["number"]},
    }
    assert picked["retries"] == {"attempts": 0}
    assert fallback["directResponse"]["status"] == 503
    assert json.loads(fallback["directResponse"]["body"]["string"])["error"]["code"] == 503
    assert service["spec"]["gateways"] == [_named(objs, "Gateway", "llm-gateway")["metadata"]["name"]]
