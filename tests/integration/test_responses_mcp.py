"""The Responses API's MCP tool loop end to end: the official `openai` client through the real Envoy, a real
MCP server from the PyPI `mcp` SDK (tests/mcp_server.py, its `add` tool) and a scripted engine that calls the
tool, then answers with its result. One stack and one MCP server serve every test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, Stack, local_stack
from tests.integration.test_agent_responses import BY_MODEL, model_dir
from tests.integration.test_responses_api import kinds_in_order

MODEL = "qwen2.5-hermes"
MCP_SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"


def call_text(a: int, b: int) -> str:
    return f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


# Rules are tried in order: later turns still hold the question, so their rules come first.
SCRIPT = [
    {"match": "denied this tool call", "text": "Understood, I did not add them."},
    {"match": "<tool_response>\n5\n</tool_response>", "text": "2 + 3 is 5."},
    {"match": "Keep adding", "text": call_text(1, 1)},
    {"match": "Add 2 and 3", "text": call_text(2, 3)},
]
MAX_ROUNDS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(MCP_SERVER), "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60  # importing the SDK takes seconds on a busy machine
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "the MCP server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("mcp-models")
    model = SimModel(
        MODEL,
        engines=1,
        model_dir=model_dir(root, BY_MODEL[MODEL]),
        sim=SimOptions(ttft_ms=1, itl_ms=0.2, script=SCRIPT),
    )
    settings = {"responses_mcp_max_rounds": MAX_ROUNDS}
    tmp = Path(tmp_path_factory.mktemp("stack"))
    with local_stack(FreePorts(), tmp, models=[model], extproc_settings=settings) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": url, "allowed_tools": ["add"], **fields}


def dump(r: Any) -> list[dict[str, Any]]:
    return [item.model_dump() for item in r.output]


def test_the_model_calls_the_tool_then_answers(client: openai.OpenAI, stack: Stack, mcp_url: str) -> None:
    before = stack.generate_requests()
    tool = mcp_tool(mcp_url, require_approval="never", headers={"Authorization": "Bearer secret"})
    r = client.responses.create(model=MODEL, input="Add 2 and 3.", tools=[tool])
    assert stack.generate_requests() == before + 2, "one engine call per round, through the router"
    listing, call, answer = dump(r)
    assert listing["type"] == "mcp_list_tools" and listing["server_label"] == "calc"
    assert listing["error"] is None
    assert [t["name"] for t in listing["tools"]] == ["add"], "allowed_tools filters the server's four"
    assert listing["tools"][0]["description"] == "Adds two integers."
    assert listing["tools"][0]["input_schema"]["properties"].keys() == {"a", "b"}
    assert call["type"] == "mcp_call" and call["name"] == "add" and call["server_label"] == "calc"
    assert json.loads(call["arguments"]) == {"a": 2, "b": 3}
    assert call["output"] == "5" and call["error"] is None, "the MCP server's own result"
    assert answer["type"] == "message" and r.output_text == "2 + 3 is 5."
    assert r.status == "completed"
    assert r.tools[0].headers is None, "credentials are not echoed"
    stored = client.responses.retrieve(r.id)
    assert dump(stored) == dump(r)
    # Chained: the earlier exchange is in the prompt (the scripted answer needs its tool result), and the
    # stored listing is reused rather than listed again.
    follow = client.responses.create(model=MODEL, input="Thanks!", tools=[tool], previous_response_id=r.id)
    assert [i.type for i in follow.output] == ["message"] and follow.output_text == "2 + 3 is 5."
    assert r.usage.input_tokens > 2 * 240, "usage adds up both engine calls"


def test_streamed_items_come_with_their_events(client: openai.OpenAI, mcp_url: str) -> None:
    tool = mcp_tool(mcp_url, require_approval="never")
    events = list(client.responses.create(model=MODEL, input="Add 2 and 3.", tools=[tool], stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds_in_order(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    indexes = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert indexes == [0, 1, 2]
    done = events[-1].response
    assert [i.type for i in done.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert done.output[1].output == "5" and done.output_text == "2 + 3 is 5."
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == [
        i.type for i in done.output
    ]


def test_a_server_that_is_down_is_an_error_item(client: openai.OpenAI) -> None:
    down = f"http://127.0.0.1:{free_port()}/mcp"
    r = client.responses.create(
        model=MODEL, input="Add 2 and 3.", tools=[mcp_tool(down, require_approval="never")]
    )
    listing = r.output[0]
    assert listing.type == "mcp_list_tools" and listing.tools == []
    assert "cannot reach the MCP server" in listing.error
    assert "mcp_call" not in [i.type for i in r.output]
    assert r.status == "completed"


def test_an_approved_call_runs_and_a_denied_one_does_not(client: openai.OpenAI, mcp_url: str) -> None:
    tool = mcp_tool(mcp_url)  # OpenAI's default: every call waits for approval
    asked = client.responses.create(model=MODEL, input="Add 2 and 3.", tools=[tool])
    listing, request = asked.output
    assert listing.type == "mcp_list_tools" and request.type == "mcp_approval_request"
    assert request.name == "add" and json.loads(request.arguments) == {"a": 2, "b": 3}
    assert asked.status == "completed"
    approve = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    approved = client.responses.create(
        model=MODEL, input=[approve], tools=[tool], previous_response_id=asked.id
    )
    call, answer = approved.output
    assert call.type == "mcp_call" and call.output == "5" and call.approval_request_id == request.id
    assert answer.type == "message" and approved.output_text == "2 + 3 is 5."
    deny = {**approve, "approve": False}
    denied = client.responses.create(model=MODEL, input=[deny], tools=[tool], previous_response_id=asked.id)
    assert [i.type for i in denied.output] == ["message"]
    assert denied.output_text == "Understood, I did not add them."


def test_the_rounds_are_bounded(client: openai.OpenAI, mcp_url: str) -> None:
    tool = mcp_tool(mcp_url, require_approval="never")
    r = client.responses.create(model=MODEL, input="Keep adding one and one.", tools=[tool])
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_tool_calls"
    calls = [i for i in r.output if i.type == "mcp_call"]
    assert [c.output for c in calls] == ["2"] * MAX_ROUNDS


def test_bad_mcp_tools_name_the_param(client: openai.OpenAI, mcp_url: str) -> None:
    cases = [
        ([{"type": "mcp", "server_url": mcp_url}], "tools[0].server_label"),
        ([{"type": "mcp", "server_label": "calc", "server_url": "ftp://h/mcp"}], "tools[0].server_url"),
        ([mcp_tool(mcp_url), mcp_tool(mcp_url)], "tools[1].server_label"),
    ]
    for tools, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="Add 2 and 3.", tools=tools)
        assert e.value.body["param"] == param, tools  # type: ignore[index]


def test_a_client_gone_midway_aborts_the_engine_call(stack: Stack, mcp_url: str) -> None:
    """Gone during the second round's answer: that engine call is aborted."""
    engine = stack.clusters[MODEL].engines[0]
    cancelled = engine.stats.cancelled + engine.stats.aborts
    calls = stack.generate_requests()
    engine.faults.set(slow=250.0)  # 0.2 ms a token becomes 50 ms
    try:
        client = stack.openai()
        tool = mcp_tool(mcp_url, require_approval="never")
        stream = client.responses.create(model=MODEL, input="Add 2 and 3.", tools=[tool], stream=True)
        kinds = []
        for e in stream:
            kinds.append(e.type)
            if e.type == "response.output_text.delta":
                break
        stream.close()
        client.close()
        deadline = time.monotonic() + 10
        while engine.stats.cancelled + engine.stats.aborts == cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        engine.faults.set(slow=1.0)
    assert "response.mcp_call.completed" in kinds
    assert engine.stats.cancelled + engine.stats.aborts == cancelled + 1, "the engine call in flight"
    assert stack.generate_requests() == calls + 2
