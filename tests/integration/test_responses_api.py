"""The Responses API end to end, through the real Envoy and the official `openai` client: responses made
by the gateway's own engine calls, stored (memory store), retrieved, chained by `previous_response_id`,
deleted; conversations and their items; instructions, function tools with a scripted engine, structured
output, reasoning items and the streamed `response.*` events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from extproc.models import default_model_dir
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, Stack, local_stack
from tests.integration.test_agent_responses import BY_MODEL, model_dir

HERMES = "qwen2.5-hermes"
THINKING = "qwen3-think"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = {"type": "input_text", "text": "What is in this picture?"}
IMAGE = {"type": "input_image", "image_url": "https://example.com/cat.png"}
FILE = {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERg==", "filename": "a.pdf"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("responses-models")
    fast = {"ttft_ms": 1, "itl_ms": 0.2}
    models = [
        SimModel(default_model_dir().name, engines=1, sim=SimOptions(**fast)),
        SimModel(
            HERMES,
            engines=1,
            model_dir=model_dir(root, BY_MODEL[HERMES]),
            sim=SimOptions(
                **fast,
                script=[
                    # The second turn holds the tool's output: the final answer.
                    {"match": "Sunny, 21C", "text": "It is sunny in Paris."},
                    {"match": "weather in Paris", "text": CALL_TEXT},
                ],
            ),
        ),
        SimModel(
            THINKING,
            engines=1,
            model_dir=model_dir(root, BY_MODEL[THINKING]),
            sim=SimOptions(**fast, script=[{"match": "*", "text": "<think>\nEasy.\n</think>\n\nFour."}]),
            tool_parser="hermes",
            reasoning_parser="think",
        ),
    ]
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("stack")), models=models) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def test_create_then_retrieve(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    r = client.responses.create(model=stack.model, input="Tell me a story.", max_output_tokens=8)
    assert stack.generate_requests() == before + 1
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (message,) = r.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert r.output_text and message.content[0].type == "output_text"
    assert r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8
    again = client.responses.retrieve(r.id)
    assert again.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id)
    assert [i.content[0].text for i in items.data] == ["Tell me a story."]


def test_a_chained_prompt_holds_the_first_exchange(client: openai.OpenAI, stack: Stack) -> None:
    first = client.responses.create(model=stack.model, input="Name a color.", max_output_tokens=5)
    second = client.responses.create(
        model=stack.model, input="And another?", previous_response_id=first.id, max_output_tokens=5
    )
    assert second.previous_response_id == first.id
    # The same conversation as chat messages: the prompt is token for token the same.
    chat = client.chat.completions.create(
        model=stack.model,
        messages=[
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another?"},
        ],
        max_tokens=1,
    )
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_instructions_are_the_system_message(client: openai.OpenAI, stack: Stack) -> None:
    r = client.responses.create(
        model=stack.model, input="Hi", instructions="Answer in French.", max_output_tokens=1
    )
    chat = client.chat.completions.create(
        model=stack.model,
        messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
        max_tokens=1,
    )
    assert r.instructions == "Answer in French."
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_unstored_and_deleted_responses_cannot_be_found(client: openai.OpenAI, stack: Stack) -> None:
    r = client.responses.create(model=stack.model, input="Hi", store=False, max_output_tokens=2)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=stack.model, input="More", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"
    kept = client.responses.create(model=stack.model, input="Hi", max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)


def test_bad_requests_name_the_param(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"input": "x", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": "x", "conversation": "conv_x", "previous_response_id": "resp_x"}, 400, "conversation"),
        ({"input": [{"type": "image", "url": "x"}]}, 400, "input[0].type"),
        # Text-only engines: an image or file is refused by name, never dropped.
        ({"input": [{"role": "user", "content": [TEXT, IMAGE]}]}, 400, "input[0].content[1].type"),
        ({"input": [{"role": "user", "content": [FILE]}]}, 400, "input[0].content[0].type"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "x", "background": True}, 400, "background"),
    ]
    for extra, status, param in cases:
        with pytest.raises(openai.APIStatusError) as e:
            client.responses.create(model=stack.model, **extra)
        assert (e.value.status_code, e.value.body["param"]) == (status, param), extra
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="no-such-model", input="x")
    assert e.value.body["param"] == "model"
    assert stack.generate_requests() == before


def test_replayed_assistant_items_keep_their_text_and_refusals(client: openai.OpenAI, stack: Stack) -> None:
    """History sent back as items (a client keeping its own state): an assistant's `output_text` and
    `refusal` parts are its turn's text in the prompt, as the same chat messages make it."""
    history = [
        {"role": "user", "content": "Say hi."},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi!", "annotations": []}],
        },
        {"role": "user", "content": "Now something rude."},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I won't."}]},
        {"role": "user", "content": "Fine."},
    ]
    r = client.responses.create(model=stack.model, input=history, max_output_tokens=1, store=False)
    chat = client.chat.completions.create(
        model=stack.model,
        messages=[
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Now something rude."},
            {"role": "assistant", "content": "I won't."},
            {"role": "user", "content": "Fine."},
        ],
        max_tokens=1,
    )
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_conversations_hold_their_items(client: openai.OpenAI, stack: Stack) -> None:
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}], metadata={"topic": "intro"}
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "intro"}
    r = client.responses.create(
        model=stack.model, input="What is my name?", conversation=conv.id, max_output_tokens=3
    )
    items = client.conversations.items.list(conv.id, order="asc")
    texts = [i.content[0].text for i in items.data]
    assert texts == ["My name is Ada.", "What is my name?", r.output_text]
    # The conversation's items were the prompt's history.
    chat = client.chat.completions.create(
        model=stack.model,
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=1,
    )
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    page = client.conversations.items.list(conv.id, order="asc", limit=1, after=items.data[0].id)
    assert [i.id for i in page.data] == [items.data[1].id] and page.has_more
    added = client.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "Thanks."}]
    )
    (new,) = added.data
    assert client.conversations.items.retrieve(new.id, conversation_id=conv.id).id == new.id
    client.conversations.items.delete(new.id, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(new.id, conversation_id=conv.id)
    updated = client.conversations.update(conv.id, metadata={"topic": "names"})
    assert client.conversations.retrieve(conv.id).metadata == updated.metadata == {"topic": "names"}
    client.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=stack.model, input="x", conversation=conv.id)


def test_function_tools_call_then_answer(client: openai.OpenAI) -> None:
    first = client.responses.create(model=HERMES, input="What is the weather in Paris?", tools=[WEATHER])
    (call,) = [i for i in first.output if i.type == "function_call"]
    assert call.id.startswith("fc_") and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.tools[0].name == "get_weather"
    second = client.responses.create(
        model=HERMES,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"}],
        tools=[WEATHER],
    )
    assert second.output_text == "It is sunny in Paris."


def test_structured_output_follows_the_schema(client: openai.OpenAI, stack: Stack) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=stack.model,
        input="Plan a trip.",
        text={"format": {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}},
    )
    answer = json.loads(r.output_text)
    assert set(answer) == {"city", "days"} and isinstance(answer["days"], int)
    assert r.text.format.type == "json_schema"


def test_reasoning_comes_as_a_reasoning_item(client: openai.OpenAI) -> None:
    r = client.responses.create(model=THINKING, input="2 + 2?")
    kinds = [i.type for i in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].id.startswith("rs_") and r.output[0].content[0].text == "Easy."
    assert r.output_text == "Four."


def kinds_in_order(events: list[Any]) -> list[str]:
    """The event types, each run of one type's deltas read as one."""
    kinds: list[str] = []
    for e in events:
        if not (e.type.endswith(".delta") and kinds and kinds[-1] == e.type):
            kinds.append(e.type)
    return kinds


def test_streamed_events_come_in_order(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=THINKING, input="2 + 2?", stream=True, metadata={"run": "1"}))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds_in_order(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-1].response
    assert done.status == "completed" and done.metadata == {"run": "1"} and done.output_text == "Four."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Four."
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Easy."
    assert events[0].response.status == "in_progress" and events[0].response.id == done.id
    (added,) = [e.item.id for e in events if e.type == "response.output_item.added" and e.output_index == 1]
    assert added == done.output[1].id
    assert client.responses.retrieve(done.id).output_text == "Four."


def test_events_come_as_the_engine_generates(client: openai.OpenAI, stack: Stack) -> None:
    """Token by token: the first text arrives long before the last, on a slowed engine."""
    engine = stack.clusters[stack.model].engines[0]
    engine.faults.set(slow=500.0)  # 0.2 ms a token becomes 100 ms
    try:
        arrivals: list[tuple[float, Any]] = []
        stream = client.responses.create(model=stack.model, input="Count.", max_output_tokens=12, stream=True)
        for e in stream:
            arrivals.append((time.monotonic(), e))
    finally:
        engine.faults.set(slow=1.0)
    texts = [(t, e) for t, e in arrivals if e.type == "response.output_text.delta"]
    assert len(texts) >= 10, "one delta per token or so"
    assert arrivals[-1][0] - texts[0][0] > 0.5
    last = arrivals[-1][1]
    assert last.type == "response.incomplete" and last.response.usage.output_tokens == 12
    assert "".join(e.delta for _, e in texts) == last.response.output_text


def test_a_streamed_call_has_argument_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=HERMES, input="What is the weather in Paris?", tools=[WEATHER], stream=True
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == {"city": "Paris"}
    assert kinds[-1] == "response.completed"


def test_a_client_gone_midway_cancels_the_engine_call(stack: Stack) -> None:
    engine = stack.clusters[stack.model].engines[0]
    before = engine.stats.cancelled + engine.stats.aborts
    engine.faults.set(slow=500.0)
    try:
        client = stack.openai()
        stream = client.responses.create(
            model=stack.model, input="Go on.", max_output_tokens=200, stream=True
        )
        for e in stream:
            if e.type == "response.output_text.delta":
                break
        stream.close()
        client.close()
        deadline = time.monotonic() + 10
        while engine.stats.cancelled + engine.stats.aborts == before and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        engine.faults.set(slow=1.0)
    assert engine.stats.cancelled + engine.stats.aborts == before + 1
