"""The settings the manifests give extproc (extproc.toml, and the extproc-env variables where a
kustomization has them) are settings extproc accepts: read by the same loader as `extproc serve`, with
only the model directory (a volume in the cluster) pointed at a local one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from extproc.config import load_settings
from extproc.models import default_model_dir
from tests.deploy.kustomize import render

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = ["kubernetes/overlays/vllm", "kubernetes/overlays/sglang", "istio", "gie"]


@pytest.mark.parametrize("kustomization", OVERLAYS)
def test_extproc_accepts_its_settings_file(kustomization: str, tmp_path: Path) -> None:
    config_maps = {
        o["metadata"]["name"]: o["data"]
        for o in render(REPO / "deploy" / kustomization)
        if o["kind"] == "ConfigMap"
    }
    text = config_maps["extproc-config"]["extproc.toml"]
    env = config_maps.get("extproc-env", {})
    cluster_dir = tomllib.loads(text)["model_dir"]
    assert cluster_dir.startswith("/models/")
    local = tmp_path / "extproc.toml"
    local.write_text(text.replace(cluster_dir, str(default_model_dir())))
    settings = load_settings({}, config_file=local, env=env)
    assert settings.listen == "0.0.0.0:50051"
    assert len(settings.engines) == 1 and settings.engines[0].startswith("k8s://")
    assert settings.metrics_host == "0.0.0.0"
    assert settings.shutdown_grace == 20
    if env:  # the plain-Kubernetes base: EDS for its Envoy, fallbacks Envoy follows
        assert settings.xds_listen == "0.0.0.0:18000"
        assert settings.destination_fallbacks == 2
    else:
        assert settings.xds_listen is None and settings.destination_fallbacks == 0
