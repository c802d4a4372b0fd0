"""Two models behind one gateway, through real Envoy with the official `openai` client: each request is
answered by the engines of the model it names (alpha's speak vLLM, beta's SGLang, both detected),
`/v1/models` lists both with their context lengths, and an unknown model is refused before any engine
sees it."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, Stack, local_stack

ALPHA, BETA = "alpha", "beta"
BETA_CONTEXT = 2048


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = [
        SimModel(ALPHA, engines=2),
        SimModel(
            BETA,
            engines=1,
            protocol="sglang",
            sim=SimOptions(max_model_len=BETA_CONTEXT),
            routing_policy="round_robin",
        ),
    ]
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("two-models")), models=models) as s:
        yield s


def served(stack: Stack) -> dict[str, int]:
    """Generate calls each model's engines have received."""
    return {
        name: sum(e.stats.generate_requests for e in cluster.engines)
        for name, cluster in stack.clusters.items()
    }


def chat(client: openai.OpenAI, model: str, text: str = "Hello there") -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=5
    )
    assert reply.model == model
    content = reply.choices[0].message.content
    assert content
    return content


def test_each_model_is_answered_by_its_own_engines(stack: Stack, client: openai.OpenAI) -> None:
    before = served(stack)
    for i in range(4):
        chat(client, ALPHA, f"alpha question {i}")
    middle = served(stack)
    assert (middle[ALPHA] - before[ALPHA], middle[BETA] - before[BETA]) == (4, 0)
    for i in range(3):
        chat(client, BETA, f"beta question {i}")
    after = served(stack)
    assert (after[ALPHA] - middle[ALPHA], after[BETA] - middle[BETA]) == (0, 3)


def test_each_models_engines_are_detected_in_their_own_protocol(stack: Stack) -> None:
    pools = stack.gateway.pools
    assert [e.protocol for e in pools[ALPHA].engines] == ["vllm", "vllm"]
    assert [e.protocol for e in pools[BETA].engines] == ["sglang"]
    assert sorted(stack.gateway.gateway.endpoints(ALPHA)) == sorted(stack.clusters[ALPHA].addresses)
    assert stack.gateway.gateway.endpoints(BETA) == stack.clusters[BETA].addresses


def test_streaming_goes_to_the_named_model_too(stack: Stack, client: openai.OpenAI) -> None:
    before = served(stack)
    stream = client.chat.completions.create(
        model=BETA, messages=[{"role": "user", "content": "stream please"}], max_tokens=5, stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.model == BETA for c in chunks)
    after = served(stack)
    assert (after[ALPHA] - before[ALPHA], after[BETA] - before[BETA]) == (0, 1)


def test_models_lists_both_with_their_context_length(stack: Stack, client: openai.OpenAI) -> None:
    listed = {m.id: m for m in client.models.list()}
    assert set(listed) == {ALPHA, BETA}
    with urllib.request.urlopen(f"{stack.base_url}/v1/models", timeout=10) as resp:
        raw = {m["id"]: m for m in json.loads(resp.read())["data"]}
    assert raw[BETA]["max_model_len"] == BETA_CONTEXT
    assert raw[ALPHA]["max_model_len"] == stack.gateway.gateway.max_context(ALPHA) > BETA_CONTEXT


def test_each_model_has_its_own_context_limit(stack: Stack, client: openai.OpenAI) -> None:
    long_text = "word " * 3000  # ~3,000 tokens: fits alpha's context, not beta's
    chat(client, ALPHA, long_text)
    before = served(stack)
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, BETA, long_text)
    assert str(BETA_CONTEXT) in str(err.value)
    assert served(stack) == before


def test_unknown_model_is_404_without_reaching_an_engine(stack: Stack, client: openai.OpenAI) -> None:
    before = stack.generate_requests()
    with pytest.raises(openai.NotFoundError) as err:
        chat(client, "gamma")
    assert "gamma" in str(err.value)
    assert stack.generate_requests() == before
