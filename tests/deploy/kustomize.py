"""A small kustomize: renders the kustomizations under deploy/ into the objects `kubectl apply -k` would
create, with no kustomize binary and no cluster.

It knows the subset the manifests use and refuses anything else, so a manifest that grows a feature
this renderer would silently ignore fails the tests instead of passing them unchecked:
- `resources`: YAML files (one or more documents) and directories holding a kustomization.yaml;
- `configMapGenerator`: `files` entries (key = the file's name), `behavior: create | replace`, and
  `options.disableNameSuffixHash: true` (names stay as written, so other objects can refer to them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_KUSTOMIZATION = "kustomization.yaml"
_KNOWN_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator"}
_GENERATOR_KEYS = {"name", "namespace", "files", "behavior", "options"}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render faithfully."""


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The objects of one YAML file (empty documents left out)."""
    with path.open() as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


def _config_map(directory: Path, generator: dict[str, Any]) -> dict[str, Any]:
    unknown = set(generator) - _GENERATOR_KEYS
    if unknown:
        raise KustomizeError(f"{directory}: configMapGenerator keys not supported: {sorted(unknown)}")
    if generator.get("options") != {"disableNameSuffixHash": True}:
        raise KustomizeError(
            f"{directory}: configMapGenerator {generator['name']!r} needs exactly "
            "options.disableNameSuffixHash: true (other objects refer to it by name)"
        )
    data = {}
    for entry in generator["files"]:
        if "=" in entry:
            raise KustomizeError(f"{directory}: 'key=file' entries are not supported: {entry!r}")
        data[Path(entry).name] = (directory / entry).read_text()
    metadata = {"name": generator["name"]}
    if "namespace" in generator:
        metadata["namespace"] = generator["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects the kustomization in `directory` produces, in order."""
    spec = load_documents(directory / _KUSTOMIZATION)[0]
    unknown = set(spec) - _KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{directory}: kustomization keys not supported: {sorted(unknown)}")
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def add(obj: dict[str, Any], source: Path) -> None:
        key = _key(obj)
        if key in objects:
            raise KustomizeError(f"{source}: {key} is defined twice")
        objects[key] = obj

    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            for obj in render(path):
                add(obj, path)
        else:
            for obj in load_documents(path):
                add(obj, path)
    for generator in spec.get("configMapGenerator", []):
        config_map = _config_map(directory, generator)
        behavior = generator.get("behavior", "create")
        key = _key(config_map)
        if behavior == "replace":
            if key not in objects:
                raise KustomizeError(f"{directory}: nothing to replace for {key}")
            objects[key] = config_map
        elif behavior == "create":
            add(config_map, directory)
        else:
            raise KustomizeError(f"{directory}: configMapGenerator behavior {behavior!r} not supported")
    return list(objects.values())


def kustomizations(root: Path) -> list[Path]:
    """Every directory under `root` with a kustomization.yaml."""
    return sorted(path.parent for path in root.rglob(_KUSTOMIZATION))


def listed_files(directory: Path) -> set[Path]:
    """The files a kustomization reads itself (resources, generator inputs), not its sub-kustomizations'."""
    spec = load_documents(directory / _KUSTOMIZATION)[0]
    files = {directory / _KUSTOMIZATION}
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_file():
            files.add(path)
    for generator in spec.get("configMapGenerator", []):
        files.update((directory / entry).resolve() for entry in generator.get("files", []))
    return {path.resolve() for path in files}
