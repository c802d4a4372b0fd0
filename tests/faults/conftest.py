"""The stack the engine-fault tests share: two simulated engines behind real Envoy, one fallback each,
routed by the default kv_events policy, so a faulty engine has a healthy one to be routed around to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with local_stack(FreePorts(), tmp_path, engines=2, fallbacks=1, routing_policy="kv_events") as s:
        yield s
