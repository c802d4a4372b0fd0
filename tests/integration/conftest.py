from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack


@pytest.fixture(scope="module", params=["ext_proc", "module"])
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The shared stack, once per response path: extproc translates engine responses, or the extproc_envoy
    module does inside Envoy (docs/architecture.md, "The response path in Envoy")."""
    tmp = Path(tmp_path_factory.mktemp("stack"))
    with local_stack(FreePorts(), tmp, response_path=request.param) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    """The official client against the module's stack."""
    return stack.openai()
