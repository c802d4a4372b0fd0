"""No class or module of the gateway, its tests or its benchmarks defines one name twice.

Python keeps the last definition without a word, and ruff does not flag methods: a second
`EnginePool._probe` once replaced the discovery probe of that name and discovered engines were never
probed (stop 31's CI); a test defined twice under one name silently never runs. A definition that means
to replace another is renamed instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def twice_defined(body: list[ast.stmt]) -> list[str]:
    """Names defined more than once directly in `body` (an overload or a property setter excepted)."""
    seen: set[str] = set()
    twice = []
    for node in body:
        if not isinstance(node, DEFINITIONS):
            continue
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if "overload" in decorators or "typing.overload" in decorators:
            continue
        if any(d.endswith((".setter", ".deleter")) for d in decorators):
            continue
        if node.name in seen:
            twice.append(f"{node.name} (line {node.lineno})")
        seen.add(node.name)
    return twice


def test_no_name_is_defined_twice_in_one_scope() -> None:
    root = Path(__file__).parents[1]
    found = []
    paths = [p for package in ("extproc", "tests", "load") for p in sorted((root / package).rglob("*.py"))]
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        found += [f"{path.relative_to(root)}: {name}" for body in scopes for name in twice_defined(body)]
    assert not found, found


def test_the_check_finds_a_method_defined_twice() -> None:
    source = "class Pool:\n    def probe(self): ...\n    async def probe(self, client): ...\n"
    pool = ast.parse(source).body[0]
    assert isinstance(pool, ast.ClassDef)
    assert twice_defined(pool.body) == ["probe (line 3)"]
