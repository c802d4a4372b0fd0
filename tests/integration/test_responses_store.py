"""The Responses API's durable stores end to end, with the official `openai` client through real Envoy:
`extproc up` keeps stored responses in SQLite in its state directory, so they outlive a restart of the
stack; and two gateway replicas sharing one real PostgreSQL server (started by the test from Debian's
binaries, tests/pg_server.py) see each other's responses and conversations.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from extproc.models import DEFAULT_MODEL_NAME
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack
from tests.integration.test_stack_up import STOP_TIMEOUT_S, running_up
from tests.pg_server import postgres_server

FAST = SimOptions(ttft_ms=1, itl_ms=0.2)


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def _assert_chained(client: openai.OpenAI, model: str, first: Any, question: str, second: Any) -> None:
    """`second`'s prompt is the first exchange plus `question`, token for token (the history was read
    back from the store)."""
    assert second.previous_response_id == first.id
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": question},
        ],
        max_tokens=1,
    )
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"extproc up did not stop within {STOP_TIMEOUT_S}s:\n{log.read_text()}")
    assert code == 0, log.read_text()


def test_up_keeps_stored_responses_across_a_restart(tmp_path: Path, free_ports: FreePorts) -> None:
    state = tmp_path / "state" / "nested"  # `up` creates it
    with running_up(tmp_path, free_ports, "--state-dir", str(state)) as (proc, port, log):
        client = _client(f"http://127.0.0.1:{port}")
        first = client.responses.create(model=DEFAULT_MODEL_NAME, input="Name a color.", max_output_tokens=5)
        forgotten = client.responses.create(model=DEFAULT_MODEL_NAME, input="Hi.", store=False)
        _stop(proc, log)
    # No responses_store given: SQLite in the state directory.
    assert (state / "responses.db").is_file()

    with running_up(tmp_path, free_ports, "--state-dir", str(state)) as (_, port, _):
        client = _client(f"http://127.0.0.1:{port}")
        again = client.responses.retrieve(first.id)
        assert again.model_dump() == first.model_dump()
        items = client.responses.input_items.list(first.id)
        assert [i.content[0].text for i in items.data] == ["Name a color."]
        second = client.responses.create(
            model=DEFAULT_MODEL_NAME, input="And another?", previous_response_id=first.id, max_output_tokens=5
        )
        _assert_chained(client, DEFAULT_MODEL_NAME, first, "And another?", second)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(forgotten.id)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def replicas(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Stack, Stack]]:
    """Two gateways (each its Envoy, extproc and engine) on one PostgreSQL store."""
    ports = FreePorts()
    settings = {"responses_store": postgres_url}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        local_stack(ports, tmp_path / "a", engines=1, sim=FAST, extproc_settings=settings) as a,
        local_stack(ports, tmp_path / "b", engines=1, sim=FAST, extproc_settings=settings) as b,
    ):
        yield a, b


def test_replicas_share_responses_through_postgres(replicas: tuple[Stack, Stack]) -> None:
    a, b = replicas
    on_a, on_b = a.openai(), b.openai()
    first = on_a.responses.create(model=a.model, input="Name a color.", max_output_tokens=5)
    assert on_b.responses.retrieve(first.id).model_dump() == first.model_dump()
    assert [i.content[0].text for i in on_b.responses.input_items.list(first.id).data] == ["Name a color."]

    second = on_b.responses.create(
        model=b.model, input="And another?", previous_response_id=first.id, max_output_tokens=5
    )
    _assert_chained(on_b, b.model, first, "And another?", second)
    assert on_a.responses.retrieve(second.id).output_text == second.output_text

    unstored = on_a.responses.create(model=a.model, input="Hi.", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        on_b.responses.retrieve(unstored.id)

    on_a.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        on_b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        on_b.responses.create(model=b.model, input="More", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"


def test_replicas_share_conversations_through_postgres(replicas: tuple[Stack, Stack]) -> None:
    a, b = replicas
    on_a, on_b = a.openai(), b.openai()
    conversation = on_a.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember: blue."}], metadata={"k": "v"}
    )
    assert on_b.conversations.retrieve(conversation.id).metadata == {"k": "v"}
    answer = on_b.responses.create(
        model=b.model, input="Which color?", conversation=conversation.id, max_output_tokens=4
    )
    items = on_a.conversations.items.list(conversation.id, order="asc").data
    assert [i.type for i in items] == ["message", "message", "message"]
    assert items[1].content[0].text == "Which color?"
    assert items[2].role == "assistant" and items[2].content[0].text == answer.output_text

    on_a.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError):
        on_b.conversations.retrieve(conversation.id)
