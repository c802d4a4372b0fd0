from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("stack"))) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    """The official client against the module's stack."""
    return stack.openai()
