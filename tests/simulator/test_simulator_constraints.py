"""Structured-output constraints over real gRPC, both protocols: json_schema, json_object, choice and regex
yield valid output (then EOS), over several seeds; what the simulator cannot honour is INVALID_ARGUMENT."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sg_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
from tokenizers import Tokenizer

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.json_schema import SchemaSampler
from extproc.simulator.regex_sample import parse_regex, sample
from extproc.simulator.script import ScriptRule

EOS = 128001
PROMPT = [128000, 9906, 11, 1917, 0, 3639, 374, 279, 7160]
SEEDS = range(6)
FAST = SimOptions(ttft_ms=0.5, itl_ms=0.1)

WEATHER_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
}
SCHEMAS = {
    "tool call": WEATHER_CALL,
    "array of calls": {"type": "array", "items": WEATHER_CALL, "minItems": 1, "maxItems": 3},
    "nested with $defs": {
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 12},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["street", "zip"],
            },
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer", "exclusiveMinimum": 0, "maximum": 120},
                    "home": {"$ref": "#/$defs/address"},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                },
                "required": ["name", "age", "home"],
            },
        },
        "type": "object",
        "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/person"}, "minItems": 2}},
        "required": ["people"],
    },
    "recursive tree": {
        "type": "object",
        "properties": {
            "label": {"type": "string", "format": "uuid"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["label", "children"],
    },
    "anyOf and scalars": {
        "type": "object",
        "properties": {
            "answer": {"anyOf": [{"type": "number", "minimum": -1, "maximum": 1}, {"type": "string"}]},
            "ok": {"type": "boolean"},
            "nothing": {"type": "null"},
            "level": {"type": ["integer", "null"], "multipleOf": 5, "maximum": 50, "minimum": 0},
            "kind": {"oneOf": [{"enum": ["a", "b"]}, {"type": "integer"}]},
        },
        "required": ["answer", "ok", "nothing", "level", "kind"],
    },
}


def valid(value: Any, schema: Any, root: Any) -> bool:
    """A tiny validator for the keywords the schemas above use (independent of the simulator's)."""
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#").split("/")[1:]:
            target = target[part]
        return valid(value, target, root)
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "anyOf" in schema and not any(valid(value, s, root) for s in schema["anyOf"]):
        return False
    if "oneOf" in schema and [valid(value, s, root) for s in schema["oneOf"]].count(True) != 1:
        return False
    types = schema.get("type")
    if types is not None:
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if not any(checks[t](value) for t in (types if isinstance(types, list) else [types])):
            return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if not set(schema.get("required", [])) <= set(value):
            return False
        if schema.get("additionalProperties") is False and not set(value) <= set(properties):
            return False
        if not all(valid(v, properties[k], root) for k, v in value.items() if k in properties):
            return False
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        if "items" in schema and not all(valid(v, schema["items"], root) for v in value):
            return False
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            return False
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return False
        if "multipleOf" in schema and value % schema["multipleOf"]:
            return False
    return True


REGEXES = [
    r"\d{3}-\d{4}",
    r"(yes|no|maybe)",
    r"[A-Z][a-z]{2,8} (St|Ave)\. [0-9]+",
    r"^(?:ab|c)*d+$",
    r"[^a-z\s]{2,5}!?",
    r"\w+@example\.(com|org)",
    r'\{"id": [1-9][0-9]{0,3}\}',
    r"a{,2}b{2,}[x-z-]?",
]


def test_every_seed_of_the_samplers_is_valid() -> None:
    """The generators behind the constraints, over many more seeds than the gRPC tests afford."""
    for schema in SCHEMAS.values():
        sampler = SchemaSampler(schema)
        for seed in range(300):
            value = json.loads(json.dumps(sampler.sample(random.Random(seed))))
            assert valid(value, schema, schema), (schema, seed, value)
    for pattern in REGEXES:
        node = parse_regex(pattern)
        for seed in range(300):
            text = sample(node, random.Random(seed))
            assert re.fullmatch(pattern, text), (pattern, seed, text)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))


@pytest.fixture
async def vllm() -> AsyncIterator[tuple[SimCluster, pb_grpc.VllmEngineStub]]:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, options=FAST)
    async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
        yield cluster, pb_grpc.VllmEngineStub(channel)
    await cluster.stop(grace=None)


@pytest.fixture
def stub(vllm: tuple[SimCluster, pb_grpc.VllmEngineStub]) -> pb_grpc.VllmEngineStub:
    return vllm[1]


def request(*, stream: bool = False, **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="c",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


async def completes(stub: pb_grpc.VllmEngineStub, req: pb.GenerateRequest) -> list[pb.GenerateComplete]:
    return [m.complete async for m in stub.Generate(req) if m.WhichOneof("response") == "complete"]


async def constrained_text(stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer, **sampling: Any) -> str:
    """The one choice's text; it must end with EOS and finish "stop"."""
    [done] = await completes(stub, request(**sampling))
    assert done.finish_reason == "stop" and done.output_ids[-1] == EOS
    return tokenizer.decode(list(done.output_ids[:-1]), skip_special_tokens=False)


@pytest.mark.parametrize("name", SCHEMAS)
async def test_json_schema_outputs_are_valid_instances(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer, name: str
) -> None:
    schema = SCHEMAS[name]
    outputs = set()
    for seed in SEEDS:
        text = await constrained_text(stub, tokenizer, json_schema=json.dumps(schema), seed=seed)
        value = json.loads(text)
        assert valid(value, schema, schema), (name, seed, text)
        outputs.add(text)
        # The same seed gives the same output.
        assert await constrained_text(stub, tokenizer, json_schema=json.dumps(schema), seed=seed) == text
    assert len(outputs) > 1  # seeds vary the instance


async def test_json_object_and_choice(stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer) -> None:
    choices = ["positive", "negative", "neutral ☺"]
    picked = set()
    for seed in SEEDS:
        obj = json.loads(await constrained_text(stub, tokenizer, json_object=True, seed=seed))
        assert isinstance(obj, dict) and obj
        choice = pb.ChoiceConstraint(choices=choices)
        picked.add(await constrained_text(stub, tokenizer, choice=choice, seed=seed))
    assert picked <= set(choices) and len(picked) > 1


@pytest.mark.parametrize("pattern", REGEXES)
async def test_regex_outputs_match_the_whole_pattern(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer, pattern: str
) -> None:
    for seed in SEEDS:
        text = await constrained_text(stub, tokenizer, regex=pattern, seed=seed)
        assert re.fullmatch(pattern, text), (pattern, seed, text)


async def test_n_choices_are_valid_seeded_variants(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    schema = SCHEMAS["nested with $defs"]
    dones = await completes(stub, request(json_schema=json.dumps(schema), n=3, seed=7, temperature=1.0))
    texts = [tokenizer.decode(list(d.output_ids[:-1])) for d in sorted(dones, key=lambda d: d.index)]
    assert all(valid(json.loads(t), schema, schema) for t in texts)
    assert len(set(texts)) > 1


async def test_max_tokens_truncates_constrained_output_with_length(
    stub: pb_grpc.VllmEngineStub, tokenizer: Tokenizer
) -> None:
    schema = json.dumps(SCHEMAS["tool call"])
    whole = await constrained_text(stub, tokenizer, json_schema=schema, seed=3)
    [cut] = await completes(stub, request(json_schema=schema, seed=3, max_tokens=5))
    assert cut.finish_reason == "length" and len(cut.output_ids) == 5
    assert whole.startswith(tokenizer.decode(list(cut.output_ids)))
    # Streamed: the same tokens, chunk by chunk.
    messages = [m async for m in stub.Generate(request(json_schema=schema, seed=3, stream=True))]
    streamed = [t for m in messages if m.WhichOneof("response") == "chunk" for t in m.chunk.token_ids]
    assert tokenizer.decode(streamed[:-1]) == whole


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"regex": r"(?=a)b"}, "lookahead (?="),
        ({"regex": r"(a)b\1"}, "backreference \\1"),
        ({"regex": r"\bword\b"}, "word boundary \\b"),
        ({"regex": r"[[:alpha:]]+"}, "POSIX class"),
        ({"regex": r"(?i)abc"}, "inline flags (?i"),
        ({"regex": r"ab("}, "invalid regex"),
        ({"grammar": 'root ::= "a"'}, "grammar (EBNF) constraints are not supported by the simulator"),
        ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag constraints are not supported"),
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": '{"not": {"type": "string"}}'}, "json_schema keyword 'not'"),
        ({"json_schema": '{"type": "string", "pattern": "(?<=x)y"}'}, "lookbehind (?<="),
        ({"choice": pb.ChoiceConstraint()}, "at least one choice"),
    ],
)
async def test_constraints_the_simulator_cannot_honour_are_invalid_argument(
    vllm: tuple[SimCluster, pb_grpc.VllmEngineStub], sampling: dict[str, Any], message: str
) -> None:
    cluster, stub = vllm
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await completes(stub, request(**sampling))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (failure.value.details() or "")
    assert cluster.engines[0].stats.rejected == 1


async def test_a_script_is_kept_under_a_constraint_it_satisfies(
    vllm: tuple[SimCluster, pb_grpc.VllmEngineStub], tokenizer: Tokenizer
) -> None:
    cluster, stub = vllm
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    script = cluster.script
    script.add(ScriptRule(text=call))
    schema = json.dumps(SCHEMAS["tool call"])
    assert await constrained_text(stub, tokenizer, json_schema=schema, seed=1) == call
    # A script the constraint rejects gives way to the constraint's own output.
    script.clear()
    script.add(ScriptRule(text='{"name": "get_time"}'))
    text = await constrained_text(stub, tokenizer, json_schema=schema, seed=1)
    assert text != '{"name": "get_time"}' and valid(
        json.loads(text), SCHEMAS["tool call"], SCHEMAS["tool call"]
    )
    assert await constrained_text(stub, tokenizer, regex="[0-9]+", seed=1) != '{"name": "get_time"}'


@pytest.fixture
async def sglang() -> AsyncIterator[sg_grpc.SglangSchedulerStub]:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, options=FAST, protocol="sglang")
    async with grpc.aio.insecure_channel(cluster.addresses[0]) as channel:
        yield sg_grpc.SglangSchedulerStub(channel)
    await cluster.stop(grace=None)


def sglang_request(**sampling: Any) -> sg.GenerateRequest:
    return sg.GenerateRequest(
        request_id="g",
        tokenized=sg.TokenizedInput(input_ids=PROMPT),
        sampling_params=sg.SamplingParams(temperature=1.0, **sampling),
    )


async def test_sglang_constraints(sglang: sg_grpc.SglangSchedulerStub, tokenizer: Tokenizer) -> None:
    schema = SCHEMAS["array of calls"]
    [reply] = [m async for m in sglang.Generate(sglang_request(json_schema=json.dumps(schema)))]
    ids = list(reply.complete.output_ids)
    assert reply.complete.finish_reason == "stop" and ids[-1] == EOS
    assert valid(json.loads(tokenizer.decode(ids[:-1])), schema, schema)
    [reply] = [m async for m in sglang.Generate(sglang_request(regex=r"[a-f]{4}-\d\d"))]
    assert re.fullmatch(r"[a-f]{4}-\d\d", tokenizer.decode(list(reply.complete.output_ids[:-1])))
    for sampling, message in (
        ({"ebnf_grammar": 'root ::= "a"'}, "grammar (EBNF) constraints are not supported by the simulator"),
        ({"structural_tag": "{}"}, "structural_tag constraints are not supported by the simulator"),
        ({"regex": "a(?!b)"}, "lookahead (?!"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            async for _ in sglang.Generate(sglang_request(**sampling)):
                pass
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (failure.value.details() or "")
