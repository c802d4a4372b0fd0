"""The load generator against a real local stack (simulated engines, extproc, real Envoy), plus its HTTP
client against a server that splits responses at every byte, and its workloads' determinism."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from extproc.models import default_model_dir
from extproc.simulator import SimOptions
from load.loadgen import (
    OpenAITarget,
    Vocab,
    Workload,
    closed_loop,
    load_trace,
    load_vocab,
    open_loop,
    poisson_arrivals,
    prepare_all,
)
from load.loadgen.http1 import ConnectionPool
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sim = SimOptions(ttft_ms=1, itl_ms=0.5)
    with local_stack(FreePorts(), tmp_path_factory.mktemp("stack"), engines=2, sim=sim) as running:
        yield running


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return load_vocab(default_model_dir() / "tokenizer.json")


# --- against the stack --------------------------------------------------------------------------------


async def test_closed_loop_sends_every_request_and_counts_tokens(stack: Stack, vocab: Vocab) -> None:
    before = stack.generate_requests()
    target = OpenAITarget(stack.base_url, stack.model, ignore_eos=True)
    specs = Workload("chat", seed=7).specs(vocab, 40)
    try:
        result = await closed_loop(target, prepare_all(target, specs), concurrency=4)
    finally:
        target.close()
    summary = result.summary()
    assert (summary["requests"], summary["ok"], summary["errors"]) == (40, 40, 0)
    assert stack.generate_requests() - before == 40
    # The token counts the workload promises are the ones the gateway's template and tokenizer produce.
    by_order = sorted(result.records, key=lambda r: r.start)
    assert sorted(r.prompt_tokens for r in by_order) == sorted(s.prompt_tokens for s in specs)
    assert 60 <= summary["prompt_tokens_mean"] <= 80  # "short chat, ~70 prompt tokens"
    assert all(r.output_tokens == 16 for r in result.records)
    assert summary["requests_per_s"] > 0 and summary["latency_ms"]["p50"] > 0
    assert summary["ttft_ms"]["count"] == 0  # nothing streamed: no first token to time


async def test_streams_have_ttft_and_inter_token_gaps(stack: Stack, vocab: Vocab) -> None:
    target = OpenAITarget(stack.base_url, stack.model, ignore_eos=True)
    specs = Workload("chat-stream", seed=8, max_tokens=12).specs(vocab, 10)
    try:
        result = await closed_loop(target, prepare_all(target, specs), concurrency=2)
    finally:
        target.close()
    assert all(r.ok for r in result.records), [r.error for r in result.records]
    for record in result.records:
        assert record.ttft is not None and 0 < record.ttft <= record.latency
        # One gap between each two of the 12 text events (the engine paces tokens 0.5 ms apart).
        assert len(record.itl) == 11 and all(gap >= 0 for gap in record.itl)
        assert record.output_tokens == 12
    summary = result.summary()
    assert summary["ttft_ms"]["count"] == 10 and summary["itl_ms"]["count"] == 110


async def test_errors_are_counted_by_status_for_a_bad_model(stack: Stack, vocab: Vocab) -> None:
    before = stack.generate_requests()
    target = OpenAITarget(stack.base_url, "no-such-model")
    specs = [*Workload("chat").specs(vocab, 5), *Workload("chat-stream").specs(vocab, 5)]
    try:
        result = await closed_loop(target, prepare_all(target, specs), concurrency=3)
    finally:
        target.close()
    summary = result.summary()
    assert (summary["ok"], summary["errors"]) == (0, 10)
    assert summary["errors_by_cause"] == {"HTTP 404": 10}
    assert "no-such-model" in (result.records[0].error or "")
    assert stack.generate_requests() == before


async def test_open_loop_starts_requests_on_schedule(stack: Stack, vocab: Vocab) -> None:
    target = OpenAITarget(stack.base_url, stack.model, ignore_eos=True)
    arrivals = poisson_arrivals(100.0, 30, seed=1)
    try:
        result = await open_loop(target, prepare_all(target, Workload("mix").specs(vocab, 30)), arrivals)
    finally:
        target.close()
    assert [r.ok for r in result.records] == [True] * 30
    assert result.wall_s >= arrivals[-1]
    assert sorted(r.start for r in result.records) == pytest.approx(arrivals)
    assert set(result.summary()["by_kind"]) <= {"chat", "chat-stream", "multi-turn", "rag-6k"}


def test_cli_writes_results_json(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = [sys.executable, "-m", "load.loadgen", "--url", stack.base_url, "--workload", "chat-stream"]
    argv += ["--requests", "20", "--concurrency", "4", "--out", str(out), "--records", "--no-progress"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ttft_ms" in proc.stdout
    data = json.loads(out.read_text())
    assert data["model"] == stack.model  # discovered from /v1/models
    assert data["summary"]["ok"] == 20 and len(data["records"]) == 20
    assert data["summary"]["ttft_ms"]["p50"] > 0


# --- the HTTP client, byte by byte ----------------------------------------------------------------------


async def test_http_client_parses_responses_split_at_every_byte(vocab: Vocab) -> None:
    events = [b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % w for w in (b"a", b"b", b"c")]
    usage = b'{"prompt_tokens":3,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}'
    events.append(b'data: {"choices":[],"usage":%s}\n\n' % usage)
    events.append(b"data: [DONE]\n\n")
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    streamed = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
    body = b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}'
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for response in (streamed, plain):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            for i in range(len(response)):
                writer.write(response[i : i + 1])
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = OpenAITarget(f"http://127.0.0.1:{port}", "m")
    try:
        first = await target.send(target.prepare(Workload("chat-stream").spec(vocab, 0)), 0.0)
        second = await target.send(target.prepare(Workload("chat").spec(vocab, 0)), 0.0)
    finally:
        target.close()
        server.close()
    assert first.ok, first.error
    assert (first.output_tokens, len(first.itl), first.cached_tokens) == (3, 2, 2)
    assert first.ttft is not None and first.ttft <= first.latency
    assert second.ok and (second.prompt_tokens, second.output_tokens) == (5, 2)
    assert second.cached_tokens is None  # the server reported no cache details
    assert connections == 1  # the connection was kept alive for the second request


async def test_a_kept_alive_connection_closed_by_the_server_is_retried_once(vocab: Vocab) -> None:
    body = b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}'
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    connections = 0

    async def read_request(reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(plain)
        await writer.drain()
        if connections == 1:
            # Idle timeout on the server's side, racing the client's next request: close unanswered.
            await read_request(reader)
        else:
            await read_request(reader)
            writer.write(plain)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target = OpenAITarget(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "m")
    prepared = target.prepare(Workload("chat").spec(vocab, 0))
    try:
        records = [await target.send(prepared, 0.0) for _ in range(3)]
    finally:
        target.close()
        server.close()
    assert [r.error for r in records] == [None, None, None]
    assert connections == 2


def test_connection_pool_rejects_other_schemes() -> None:
    with pytest.raises(ValueError):
        ConnectionPool("https://example.com")


# --- workloads and traces -------------------------------------------------------------------------------


def test_workloads_are_deterministic_and_unique(vocab: Vocab) -> None:
    a = Workload("rag-6k", seed=3).specs(vocab, 3)
    assert a == Workload("rag-6k", seed=3).specs(vocab, 3)
    assert len({s.messages[1].text.content for s in a}) == 3
    assert a[0] != Workload("rag-6k", seed=4).spec(vocab, 0)
    assert all(6590 <= s.prompt_tokens <= 6610 for s in a)
    assert 29_990 <= Workload("rag-30k").spec(vocab, 0).prompt_tokens <= 30_010


def test_prompt_ids_are_what_the_tokenizer_gives(vocab: Vocab) -> None:
    tokenizer = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    for spec in Workload("mix", seed=5).specs(vocab, 6):
        for message in spec.messages:
            assert (
                list(message.text.ids) == tokenizer.encode(message.text.content, add_special_tokens=False).ids
            )


def test_multi_turn_requests_extend_their_conversation(vocab: Vocab) -> None:
    from load.loadgen.workloads import CONVERSATIONS_IN_FLIGHT as K

    turn0, turn1, turn2 = (Workload("multi-turn").spec(vocab, i * K) for i in range(3))
    assert turn1.messages[: len(turn0.messages)] == turn0.messages
    assert turn2.messages[: len(turn1.messages) - 1] == turn1.messages[:-1]
    assert [m.role for m in turn2.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    other = Workload("multi-turn").spec(vocab, 1)  # another conversation: same system prompt only
    assert other.messages[0] == turn0.messages[0] and other.messages[1] != turn0.messages[1]


def test_trace_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text('# seconds\n10.5\n{"t": 10.0}\n\n{"timestamp": 12}\n')
    assert load_trace(path) == [0.0, 0.5, 2.0]
    path.write_text("soon\n")
    with pytest.raises(ValueError, match=r"trace\.txt:1"):
        load_trace(path)


def test_the_tool_call_workload_declares_its_tool_and_its_scripted_call_fits(vocab: Vocab) -> None:
    """tool-stream sends the tool (so the template shows its name, which the engines' script answers with
    the Hermes call) and asks for room for the whole call; plain-stream is the same length without tools."""
    from load.loadgen.workloads import AGENT_ANSWER_TOKENS, BENCH_TOOL_NAME, TOOL_CALL_TEXT, TOOL_SCRIPT

    tools, plain = Workload("tool-stream").spec(vocab, 0), Workload("plain-stream").spec(vocab, 0)
    body = OpenAITarget("http://127.0.0.1:1", "m", ignore_eos=True).body(tools)
    assert [t["function"]["name"] for t in body["tools"]] == [BENCH_TOOL_NAME] and body["stream"]
    assert "tools" not in OpenAITarget("http://127.0.0.1:1", "m").body(plain)
    assert tools.max_tokens == plain.max_tokens == AGENT_ANSWER_TOKENS
    tokenizer = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    call_tokens = len(tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False).ids)
    assert 150 <= call_tokens < AGENT_ANSWER_TOKENS
    arguments = json.loads(TOOL_CALL_TEXT.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert arguments["name"] == BENCH_TOOL_NAME and TOOL_SCRIPT[0]["match"] == BENCH_TOOL_NAME
