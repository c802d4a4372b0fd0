"""Envoy's subset hint (the endpoint-picker protocol): a filter before extproc restricts the engines a
request may go to; extproc picks only among them, and answers 503 when none of them is ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError

from extproc import contracts
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack

TYPE = "type.googleapis.com/"


def _hint(addresses: list[str]) -> dict[str, Any]:
    """Envoy's set_metadata filter writing the hint, as a gateway in front of extproc would."""
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": TYPE + "envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [
                {
                    "metadata_namespace": contracts.SUBSET_HINT_NAMESPACE,
                    "value": {contracts.SUBSET_HINT_KEY: addresses},
                }
            ],
        },
    }


def _chat(stack: Stack, i: int) -> None:
    client = stack.openai(timeout=20)
    client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=2
    )


def test_requests_go_only_to_the_hinted_engine(tmp_path: Path) -> None:
    hint = lambda addresses: [_hint([addresses[1]])]  # noqa: E731
    with local_stack(
        FreePorts(), tmp_path, engines=3, routing_policy="round_robin", filters_before=hint
    ) as stack:
        engines = stack.engines.engines
        for i in range(6):  # round robin would spread these over all three
            _chat(stack, i)
        assert [e.stats.completed for e in engines] == [0, 6, 0]


def test_a_hint_naming_no_ready_engine_gives_503_before_any_engine(tmp_path: Path) -> None:
    hint = lambda addresses: [_hint(["127.0.0.1:9"])]  # noqa: E731
    with local_stack(FreePorts(), tmp_path, engines=2, filters_before=hint) as stack:
        with pytest.raises(APIStatusError) as err:
            _chat(stack, 0)
        assert err.value.status_code == 503
        assert "subset hint" in err.value.message
        assert sum(e.stats.generate_requests for e in stack.engines.engines) == 0
