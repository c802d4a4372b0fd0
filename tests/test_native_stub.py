"""The `.pyi` stub and the extension must not drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

from extproc import _native

STUB = Path(__file__).parent.parent / "extproc" / "_native.pyi"


def stub_api() -> dict[str, set[str]]:
    tree = ast.parse(STUB.read_text())
    api: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            api[node.name] = {
                f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("__")
            }
    return api


def test_stub_lists_exactly_the_public_api_of_the_extension() -> None:
    for name, methods in stub_api().items():
        cls = getattr(_native, name)
        public = {m for m in dir(cls) if not m.startswith("_")}
        assert public == methods, name
    exported = {n for n in dir(_native) if not n.startswith("_") and isinstance(getattr(_native, n), type)}
    assert exported == set(stub_api())
