from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack


class SharedStacks:
    """The default stack (two simulated engines, kv_events routing), one per response path, started when a
    test first asks for that path and stopped when the package's tests are done. Every module that uses the
    shared `stack` gets the same one: its tests count engine calls as differences and use prompts of their
    own, so they neither change it nor depend on it being fresh (each used to start a pair of its own)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, exits: contextlib.ExitStack) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._exits = exits
        self._ports = FreePorts()
        self._stacks: dict[str, Stack] = {}

    def get(self, response_path: str) -> Stack:
        if response_path not in self._stacks:
            tmp = Path(self._tmp_path_factory.mktemp(f"stack-{response_path}"))
            # No request log: its lines are printed by a background task, and a stack that outlives the
            # module that started it would print them wherever pytest's output happens to be then.
            settings = {"request_log": False}
            stack = local_stack(self._ports, tmp, response_path=response_path, extproc_settings=settings)
            self._stacks[response_path] = self._exits.enter_context(stack)
        return self._stacks[response_path]


@pytest.fixture(scope="package")
def shared_stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStacks]:
    with contextlib.ExitStack() as exits:
        yield SharedStacks(tmp_path_factory, exits)


@pytest.fixture(scope="module", params=["ext_proc", "module"])
def stack(shared_stacks: SharedStacks, request: pytest.FixtureRequest) -> Stack:
    """The shared stack, once per response path: extproc translates engine responses, or the extproc_envoy
    module does inside Envoy (docs/architecture.md, "The response path in Envoy")."""
    return shared_stacks.get(request.param)


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    """The official client against the module's stack."""
    return stack.openai()
