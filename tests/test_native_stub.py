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


def stub_constants() -> dict[str, str]:
    """Module-level `NAME: type` declarations of the stub: name -> the annotation's source."""
    tree = ast.parse(STUB.read_text())
    return {
        node.target.id: ast.unparse(node.annotation)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def test_stub_declares_exactly_the_constants_of_the_extension_with_their_types() -> None:
    values = {n: v for n, v in vars(_native).items() if not n.startswith("_") and not isinstance(v, type)}
    declared = stub_constants()
    assert set(values) == set(declared)
    for name, value in values.items():
        if declared[name] == "str":
            assert isinstance(value, str) and value, name
        else:
            assert declared[name] == "tuple[str, ...]", name
            assert isinstance(value, tuple) and value and all(isinstance(v, str) for v in value), name


def test_stub_lists_exactly_the_public_api_of_the_extension() -> None:
    for name, methods in stub_api().items():
        cls = getattr(_native, name)
        public = {m for m in dir(cls) if not m.startswith("_")}
        assert public == methods, name
    exported = {n for n in dir(_native) if not n.startswith("_") and isinstance(getattr(_native, n), type)}
    assert exported == set(stub_api())
