"""Black-box conformance of extproc as a Gateway API Inference Extension endpoint picker: a data plane
written from the protocol (tests/gie/dataplane.py) drives extproc's ext_proc port directly, with
simulated engines behind it and no Envoy. Each test is one row of docs/gie.md's conformance table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from extproc.simulator import SimOptions
from tests.gie import dataplane as dp
from tests.gie.picker import Picker, running_picker
from tests.integration.harness import wait_for

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
FALLBACKS = 2


@pytest.fixture(scope="module")
def picker() -> Iterator[Picker]:
    # Three engines, least load (fallbacks ordered by load), two fallbacks after the primary.
    with running_picker(
        engines=3, routing_policy="least_load", destination_fallbacks=FALLBACKS, load_interval=0.05
    ) as p:
        yield p


def chat(picker: Picker, text: str = "hello", **fields: Any) -> dict[str, Any]:
    body = {"model": picker.model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return body | fields


def assert_routed(picker: Picker, picked: dp.Picked) -> None:
    """The protocol's destination: header and metadata carry the same list, of the pool's engines,
    each once; Envoy retries once per fallback, no more."""
    assert picked.status is None, f"answered {picked.status}: {picked.body!r}"
    assert picked.header_destination is not None
    assert picked.metadata_destination == picked.header_destination
    assert set(picked.endpoints) <= set(picker.addresses)
    assert len(set(picked.endpoints)) == len(picked.endpoints)
    assert picked.headers["x-envoy-max-retries"] == str(len(picked.endpoints) - 1)
    assert picked.headers[":path"] == GENERATE


def test_the_destination_header_and_metadata_agree(picker: Picker) -> None:
    call = picker.call()
    picked = dp.pick(call, chat(picker))
    call.cancel()
    assert_routed(picker, picked)
    # Three engines, two fallbacks: every engine is on the list, the primary first.
    assert sorted(picked.endpoints) == sorted(picker.addresses)


def test_fallbacks_follow_the_primary_best_first(picker: Picker) -> None:
    busy, loaded, idle = picker.engines.engines
    queued = [picker.queue_on(busy, 4), picker.queue_on(loaded, 2)]
    try:
        call = picker.call()
        picked = dp.pick(call, chat(picker))
        call.cancel()
    finally:
        picker.release(busy, queued[0])
        picker.release(loaded, queued[1])
    assert_routed(picker, picked)
    assert picked.endpoints == [idle.address, loaded.address, busy.address]


@pytest.mark.parametrize("form", ["list", "comma_string"])
def test_the_subset_hint_is_honoured_in_both_forms(picker: Picker, form: str) -> None:
    first, _, third = picker.addresses
    allowed = [first, third]
    hint: list[str] | str = allowed if form == "list" else f"{first}, {third}"
    for i in range(6):
        call = picker.call()
        picked = dp.pick(call, chat(picker, f"question {i}"), subset=hint)
        call.cancel()
        assert_routed(picker, picked)
        # Fallbacks too stay inside the subset: the list is exactly the two hinted engines.
        assert sorted(picked.endpoints) == sorted(allowed)


def test_a_hint_of_addresses_outside_the_pool_is_reduced_to_the_pool(picker: Picker) -> None:
    call = picker.call()
    picked = dp.pick(call, chat(picker), subset=["10.255.255.1:8000", picker.addresses[1]])
    call.cancel()
    assert_routed(picker, picked)
    assert picked.endpoints == [picker.addresses[1]]


@pytest.mark.parametrize("hint", [[], ["127.0.0.1:9"], ""], ids=["empty_list", "unknown", "empty_string"])
def test_a_hint_naming_no_eligible_endpoint_is_503(picker: Picker, hint: list[str] | str) -> None:
    before = picker.generate_requests()
    call = picker.call()
    picked = dp.pick(call, chat(picker), subset=hint)
    assert picked.status == 503
    assert picked.error()["type"] == "service_unavailable"
    assert picker.generate_requests() == before


def test_503_and_not_ready_when_no_endpoint_is_ready(picker: Picker) -> None:
    assert {s: picker.health(s) for s in ("liveness", "readiness", dp.EXT_PROC_SERVICE)} == dict.fromkeys(
        ("liveness", "readiness", dp.EXT_PROC_SERVICE), "SERVING"
    )
    for engine in picker.engines.engines:
        picker.set_ready(engine, False)
    try:
        call = picker.call()
        picked = dp.pick(call, chat(picker))
        # Alive (keep the pod), not ready (take it out of the Service) and the ext_proc service follows
        # readiness, as the protocol says.
        statuses = {s: picker.health(s) for s in ("liveness", "readiness", dp.EXT_PROC_SERVICE)}
    finally:
        for engine in picker.engines.engines:
            picker.set_ready(engine, True)
    assert picked.status == 503
    assert picked.error()["type"] == "service_unavailable"
    assert statuses == {"liveness": "SERVING", "readiness": "NOT_SERVING", dp.EXT_PROC_SERVICE: "NOT_SERVING"}
    assert picker.health(dp.EXT_PROC_SERVICE) == "SERVING"


def test_an_unknown_health_service_is_not_found(picker: Picker) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        picker.health("inference-pool")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_clients_own_destination_header_is_overwritten(picker: Picker) -> None:
    own = {dp.DESTINATION_HEADER: "10.255.255.1:8000", "x-envoy-max-retries": "9"}
    call = picker.call()
    picked = dp.pick(call, chat(picker), headers=own)
    call.cancel()
    assert_routed(picker, picked)
    assert "10.255.255.1:8000" not in picked.header_destination  # type: ignore[operator]


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [',
        b"not json at all",
        b"[1, 2]",
        b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}',
    ],
    ids=["truncated", "not_json", "not_an_object", "wrong_type"],
)
def test_a_body_that_is_no_valid_request_is_400(picker: Picker, body: bytes) -> None:
    before = picker.generate_requests()
    call = picker.call()
    picked = dp.pick(call, body)
    assert picked.status == 400
    assert picked.error()["type"] == "invalid_request_error"
    assert picker.generate_requests() == before


def engine_request(picked: dp.Picked) -> vllm.GenerateRequest:
    return vllm.GenerateRequest.FromString(dp.grpc_message(picked.body))


@pytest.mark.parametrize("chunk_size", [1, 3, 64], ids=["1_byte", "3_bytes", "64_bytes"])
def test_a_body_split_into_many_chunks_is_the_same_request(picker: Picker, chunk_size: int) -> None:
    body = chat(picker, "a question split into very small pieces, é ü 漢字 included", temperature=0.5)
    whole_call = picker.call()
    whole = dp.pick(whole_call, body)
    whole_call.cancel()
    split_call = picker.call()
    split = dp.pick(split_call, body, chunk_size=chunk_size)
    split_call.cancel()
    assert_routed(picker, split)
    a, b = engine_request(whole), engine_request(split)
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert len(raw) > 2 * chunk_size and len(raw) > len(json.dumps(body, ensure_ascii=False))
    assert b.tokenized.input_ids == a.tokenized.input_ids and len(a.tokenized.input_ids) > 10
    assert b.sampling_params == a.sampling_params


def test_a_request_served_by_its_primary_answers_the_client(picker: Picker) -> None:
    call = picker.call()
    picked = dp.pick(call, chat(picker))
    assert_routed(picker, picked)
    primary = picked.endpoints[0]
    with grpc.insecure_channel(primary) as engine:
        messages = engine.unary_stream(GENERATE)(dp.grpc_message(picked.body))
        status, body = dp.engine_answer(call, messages, served=primary)
    assert status == 200
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("via", ["metadata", "attribute"])
def test_the_served_endpoint_reported_back_is_the_one_extproc_follows(picker: Picker, via: str) -> None:
    """The gateway tried the primary, it failed, a fallback served: extproc reads that from
    `envoy.lb/x-gateway-destination-endpoint-served` (or Envoy's `upstream.address`) and acts on the
    fallback: when the client goes away, the Abort goes to the engine that runs the request."""
    by_address = {e.address: e for e in picker.engines.engines}
    call = picker.call()
    body = chat(picker, stream=True, max_tokens=2000, ignore_eos=True)
    picked = dp.pick(call, body)
    assert_routed(picker, picked)
    primary, fallback = by_address[picked.endpoints[0]], by_address[picked.endpoints[1]]
    aborts = {e.address: e.stats.abort_calls for e in picker.engines.engines}
    with grpc.insecure_channel(fallback.address) as engine:
        messages = engine.unary_stream(GENERATE)(dp.grpc_message(picked.body))
        call.send(dp.response_headers(fallback.address, via=via))
        call.send(dp.ep.ProcessingRequest(response_body=dp.ep.HttpBody(body=dp.grpc_frame(next(messages)))))
        assert call.reply().WhichOneof("response") == "response_headers"
        call.cancel()  # the client went away
        assert wait_for(lambda: fallback.stats.abort_calls == aborts[fallback.address] + 1, timeout=10)
        messages.cancel()
    assert primary.stats.abort_calls == aborts[primary.address]


def shedding_config() -> str:
    return json.dumps({"shed_queue_depth": 1, "objectives": {"batch": -1, "chat": 10}})


def test_a_sheddable_request_is_429_when_every_engine_is_saturated() -> None:
    with running_picker(engines=1, load_interval=0.05, routing_config=shedding_config()) as picker:
        (engine,) = picker.engines.engines
        queued = picker.queue_on(engine, 2)
        try:
            before = picker.generate_requests()
            shed_call = picker.call()
            shed = dp.pick(shed_call, chat(picker), headers={dp.OBJECTIVE_HEADER: "batch"})
            # A request of a higher priority queues at the engine instead.
            kept_call = picker.call()
            kept = dp.pick(kept_call, chat(picker), headers={dp.OBJECTIVE_HEADER: "chat"})
            kept_call.cancel()
            after = picker.generate_requests()
        finally:
            picker.release(engine, queued)
    assert shed.status == 429
    assert shed.error()["type"] == "rate_limit_error"
    assert after == before
    assert_routed(picker, kept)


def test_a_saturated_pool_without_sheddable_requests_still_routes() -> None:
    # Shedding needs the shed_queue_depth setting: without it a queue never refuses.
    with running_picker(engines=1, load_interval=0.05, sim=SimOptions()) as picker:
        (engine,) = picker.engines.engines
        queued = picker.queue_on(engine, 2)
        try:
            call = picker.call()
            picked = dp.pick(call, chat(picker), headers={dp.OBJECTIVE_HEADER: "batch"})
            call.cancel()
        finally:
            picker.release(engine, queued)
    assert_routed(picker, picked)
