"""Scripted outputs over real gRPC: a configured text per prompt pattern or model comes back as its
tokens, then EOS, under the usual stop rules; special-token strings become their ids; HTTP scripts one
request."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
from tokenizers import Tokenizer

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimEngine, SimOptions, start_engines
from extproc.simulator.__main__ import parse_args
from extproc.simulator.command import simulator_argv
from extproc.simulator.script import ScriptRule

EOS = 128001  # the default model's first eos id: what a natural end emits
EOT = 128009  # <|eot_id|>, the tokenizer's own EOS
WEATHER = "It is 18 degrees and sunny in Paris."
DEFAULT = "I can help with that."
RULES = (
    ScriptRule(match=r"weather in \w+", text=WEATHER),
    ScriptRule(match="*", text="never: another model", model="qwen*"),
    ScriptRule(match="*", text=DEFAULT, model="llama3-*"),
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))


def prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    return [128000, *tokenizer.encode(text, add_special_tokens=False).ids]


def request(ids: list[int], *, stream: bool = False, **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="s",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def completes(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[pb.GenerateComplete]:
    return [m.complete async for m in stub.Generate(req) if m.WhichOneof("response") == "complete"]


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    options = SimOptions(ttft_ms=0.5, itl_ms=0.2, script=RULES)
    cluster = await start_engines(
        default_model_dir(), count=1, base_port=0, options=options, metrics_base_port=0
    )
    yield cluster
    await cluster.stop(grace=None)


@pytest.fixture
async def stub(sim: SimCluster) -> AsyncIterator[pb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        yield pb_grpc.VllmEngineStub(channel)


async def test_the_first_matching_rule_answers_with_its_text_then_eos(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    scripted = tokenizer.encode(WEATHER, add_special_tokens=False).ids
    [done] = await completes(stub, request(prompt(tokenizer, "What is the weather in Paris today?")))
    assert list(done.output_ids) == [*scripted, EOS]
    assert done.finish_reason == "stop" and done.matched_token_id == EOS
    assert tokenizer.decode(list(done.output_ids)) == WEATHER
    # No pattern matches: the catch-all rule for this model (the rule for other models never answers).
    [other] = await completes(stub, request(prompt(tokenizer, "Tell me a joke.")))
    assert tokenizer.decode(list(other.output_ids)) == DEFAULT


async def test_streamed_scripted_output_equals_the_non_streamed_one(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    ids = prompt(tokenizer, "the weather in Oslo?")
    messages = [m async for m in stub.Generate(request(ids, stream=True))]
    streamed = [t for m in messages if m.WhichOneof("response") == "chunk" for t in m.chunk.token_ids]
    [whole] = await completes(stub, request(ids))
    assert streamed == list(whole.output_ids)
    assert messages[-1].complete.finish_reason == "stop"


async def test_max_tokens_truncates_the_script_with_length(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    scripted = tokenizer.encode(WEATHER, add_special_tokens=False).ids
    [done] = await completes(stub, request(prompt(tokenizer, "weather in Rome"), max_tokens=4))
    assert list(done.output_ids) == scripted[:4]
    assert done.finish_reason == "length"
    # Exactly the script's length: the script fits, EOS does not.
    [exact] = await completes(stub, request(prompt(tokenizer, "weather in Rome"), max_tokens=len(scripted)))
    assert list(exact.output_ids) == scripted and exact.finish_reason == "length"


async def test_every_choice_says_the_script(stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer) -> None:
    dones = await completes(stub, request(prompt(tokenizer, "weather in Lima"), n=3, temperature=0.8))
    assert sorted(d.index for d in dones) == [0, 1, 2]
    assert {tokenizer.decode(list(d.output_ids)) for d in dones} == {WEATHER}


async def test_stop_strings_and_tokens_inside_the_script_end_it_there(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    ids = prompt(tokenizer, "weather in Nice")
    [done] = await completes(stub, request(ids, stop=["sunny"]))
    assert done.finish_reason == "stop" and done.matched_stop_str == "sunny"
    assert tokenizer.decode(list(done.output_ids)) == "It is 18 degrees and sunny"
    degrees = tokenizer.encode(" degrees", add_special_tokens=False).ids[0]
    [by_id] = await completes(stub, request(ids, stop_token_ids=[degrees]))
    assert (
        by_id.matched_token_id == degrees and tokenizer.decode(list(by_id.output_ids)) == "It is 18 degrees"
    )


async def test_min_tokens_past_the_script_keeps_generating_words(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    scripted = tokenizer.encode(WEATHER, add_special_tokens=False).ids
    [done] = await completes(
        stub, request(prompt(tokenizer, "weather in Bern"), min_tokens=len(scripted) + 5)
    )
    assert list(done.output_ids[: len(scripted)]) == scripted
    assert len(done.output_ids) >= len(scripted) + 5 and done.output_ids[-1] == EOS


async def test_special_token_strings_become_their_ids(sim: SimCluster, tokenizer: Tokenizer) -> None:
    text = "<|start_header_id|>assistant<|end_header_id|>\n\nDone.<|eot_id|>"
    sim.script.add(ScriptRule(text=text, count=1))
    async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
        [done] = await completes(pb_grpc.VllmEngineStub(channel), request(prompt(tokenizer, "hi")))
    ids = list(done.output_ids)
    assert ids[0] == 128006 and ids[2] == 128007  # the header markers, one id each
    # The script's own <|eot_id|> is the tokenizer's EOS: it ends the answer, nothing follows it.
    assert ids[-1] == EOT and ids.count(EOT) == 1 and done.finish_reason == "stop"
    assert not done.HasField("matched_token_id")
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


async def test_a_llama_3_1_python_tag_is_one_special_token(tmp_path: Path) -> None:
    """A tokenizer with `<|python_tag|>` (Llama 3.1 names reserved id 128010 so) emits it as that id; one
    without it spells the string out in ordinary tokens."""
    model = tmp_path / "llama31-like"
    shutil.copytree(default_model_dir(), model)
    data = json.loads((model / "tokenizer.json").read_text())
    for added in data["added_tokens"]:
        if added["id"] == 128010:
            added["content"] = "<|python_tag|>"
    (model / "tokenizer.json").write_text(json.dumps(data))
    call = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    options = SimOptions(ttft_ms=0.5, itl_ms=0.2, script=[{"text": call}])
    for directory, special in ((model, True), (default_model_dir(), False)):
        cluster = await start_engines(directory, count=1, base_port=0, options=options)
        try:
            async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
                [done] = await completes(pb_grpc.VllmEngineStub(channel), request([128000, 9906]))
        finally:
            await cluster.stop(grace=None)
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        ids = list(done.output_ids)
        assert (ids[0] == 128010) is special
        assert tokenizer.decode(ids[:-1], skip_special_tokens=False) == call


async def http(engine: SimEngine, method: str, path: str, body: object = None) -> tuple[int, object]:
    def call() -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{engine.metrics_port}{path}", data=data, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    return await asyncio.to_thread(call)


async def test_a_cluster_shares_its_rules_so_one_request_is_scripted_once(tokenizer: Tokenizer) -> None:
    cluster = await start_engines(default_model_dir(), count=2, base_port=0, options=SimOptions(itl_ms=0.2))
    try:
        cluster.script.add(ScriptRule(text="Only once.", count=1))
        texts = []
        for address in cluster.addresses:  # one request to each engine
            async with grpc.aio.insecure_channel(address) as channel:
                [done] = await completes(pb_grpc.VllmEngineStub(channel), request([128000, 9906]))
            texts.append(tokenizer.decode(list(done.output_ids)))
    finally:
        await cluster.stop(grace=None)
    assert texts[0] == "Only once." and texts[1] != "Only once."
    assert cluster.script.as_list() == []


async def test_http_scripts_one_request_ahead_of_the_configured_rules(
    sim: SimCluster, stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    engine = sim.engines[0]
    status, rules = await http(engine, "POST", "/script", {"match": "weather", "text": "Rain.", "count": 1})
    assert status == 200 and rules[0] == {"text": "Rain.", "match": "weather", "model": None, "count": 1}
    ids = prompt(tokenizer, "weather in Oslo")
    [first] = await completes(stub, request(ids))
    [second] = await completes(stub, request(ids))
    assert tokenizer.decode(list(first.output_ids)) == "Rain."
    assert tokenizer.decode(list(second.output_ids)) == WEATHER  # used up: the configured rule again
    status, rules = await http(engine, "GET", "/script")
    assert status == 200 and [r["text"] for r in rules] == [WEATHER, DEFAULT]
    await http(engine, "POST", "/script", [{"text": "Always."}])
    [third] = await completes(stub, request(ids))
    assert tokenizer.decode(list(third.output_ids)) == "Always."
    status, rules = await http(engine, "DELETE", "/script")
    assert status == 200 and [r["text"] for r in rules] == [WEATHER, DEFAULT]
    assert (await http(engine, "POST", "/script", {"text": "x", "match": "("}))[0] == 400
    assert (await http(engine, "POST", "/script", {"words": "x"}))[0] == 400


async def test_without_rules_answers_are_plausible_words(tokenizer: Tokenizer) -> None:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, options=SimOptions(itl_ms=0.2))
    try:
        async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
            [done] = await completes(
                pb_grpc.VllmEngineStub(channel), request(prompt(tokenizer, "weather in X"))
            )
    finally:
        await cluster.stop(grace=None)
    assert tokenizer.decode(list(done.output_ids)) not in (WEATHER, DEFAULT)
    assert len(done.output_ids) >= 8


def test_the_command_line_carries_script_rules(tmp_path: Path) -> None:
    options = SimOptions(script=RULES)
    args = parse_args(simulator_argv(options, engines=1)[3:])
    assert args.options == options
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"match": "hello", "text": "Hi!"}]))
    assert parse_args(["--port", "0", "--script", f"@{path}"]).options.script == (
        ScriptRule(match="hello", text="Hi!"),
    )
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--script", '[{"match": "[", "text": "x"}]'])
