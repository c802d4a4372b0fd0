"""The request stream (`Gateway.new_stream`) writes each engine's own Generate request, checked against
the real generated stubs of both protocols, and names the protocol to abort with."""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from extproc import _native, contracts
from tests.conftest import DEFAULT_MODEL, default_gateway

MODEL = DEFAULT_MODEL
ENGINE = "127.0.0.1:9"
DESTINATION = contracts.DESTINATION_HEADER
LB_NAMESPACE = contracts.LB_METADATA_NAMESPACE


@pytest.fixture(scope="module")
def gateway() -> _native.Gateway:
    gateway = default_gateway(MODEL)
    return gateway


def send(gateway: _native.Gateway, body: dict) -> tuple[_native.Stream, list[ep.ProcessingResponse]]:
    stream = gateway.new_stream()
    pairs = {":method": "POST", ":path": "/v1/completions", "x-request-id": "req-1"}
    headers = core.HeaderMap(
        headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )
    assert (
        stream.process(
            ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=headers)).SerializeToString()
        )
        == []
    )
    message = ep.ProcessingRequest(
        request_body=ep.HttpBody(body=json.dumps(body).encode(), end_of_stream=True)
    )
    return stream, [ep.ProcessingResponse.FromString(r) for r in stream.process(message.SerializeToString())]


def routed(replies: list[ep.ProcessingResponse]) -> tuple[str, bytes]:
    """The engine method path and the unframed Generate request the stream sends."""
    mutation = replies[0].request_headers.response.header_mutation
    path = next(o.header.raw_value.decode() for o in mutation.set_headers if o.header.key == ":path")
    framed = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in replies[1:])
    assert framed[0] == 0 and int.from_bytes(framed[1:5], "big") == len(framed) - 5
    return path, framed[5:]


def test_sglang_engines_get_sglangs_request_with_its_defaults(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(MODEL, [(ENGINE, 0, "sglang")])
    stream, replies = send(gateway, {"model": MODEL, "prompt": "Hi", "n": 2, "logprobs": 3, "max_tokens": 5})
    path, body = routed(replies)
    assert path == "/sglang.grpc.scheduler.SglangScheduler/Generate"
    request = sglang.GenerateRequest.FromString(body)
    params = request.sampling_params
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (1.0, 1.0, -1, 1.0)
    assert (params.n, params.max_new_tokens) == (2, 5)
    assert request.return_logprob and request.top_logprobs_num == 3 and request.logprob_start_len == -1
    # The engine knows the request by an id of extproc's own, never the client's x-request-id.
    assert request.request_id.startswith("extproc-") and request.request_id != "req-1"
    assert stream.pending_abort() == (ENGINE, request.request_id, "sglang")


def test_vllm_engines_get_vllms_request(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(MODEL, [(ENGINE, 0)])
    stream, replies = send(gateway, {"model": MODEL, "prompt": "Hi", "n": 3, "logprobs": 0, "seed": 5})
    path, body = routed(replies)
    assert path == "/vllm.grpc.engine.VllmEngine/Generate"
    request = vllm.GenerateRequest.FromString(body)
    params = request.sampling_params
    assert not params.HasField("temperature")
    assert (params.n, params.logprobs, params.seed) == (3, 0, 5)
    assert request.request_id.startswith("extproc-") and request.request_id != "req-1"
    assert stream.pending_abort() == (ENGINE, request.request_id, "vllm")


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_a_data_parallel_engine_gets_the_rank_and_envoy_the_address(
    gateway: _native.Gateway, protocol: str
) -> None:
    stubs = vllm if protocol == "vllm" else sglang
    gateway.set_endpoints(MODEL, [(ENGINE, 0, protocol, 2)])
    ranks = set()
    for _ in range(4):
        stream, replies = send(gateway, {"model": MODEL, "prompt": "Hi"})
        _, body = routed(replies)
        request = stubs.GenerateRequest.FromString(body)
        assert request.HasField("data_parallel_rank")
        ranks.add(request.data_parallel_rank)
        headers = replies[0].request_headers.response.header_mutation.set_headers
        destination = next(o.header.raw_value.decode() for o in headers if o.header.key == DESTINATION)
        assert destination == ENGINE
        assert (
            replies[0].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value
            == ENGINE
        )
        summary = stream.summary()
        assert (summary["endpoint"], summary["dp_rank"]) == (ENGINE, request.data_parallel_rank)
        assert stream.pending_abort() == (ENGINE, request.request_id, protocol)
    assert ranks == {0, 1}
    # One rank: no pin, and the summary has no rank.
    gateway.set_endpoints(MODEL, [(ENGINE, 0, protocol, 1)])
    stream, replies = send(gateway, {"model": MODEL, "prompt": "Hi"})
    _, body = routed(replies)
    assert not stubs.GenerateRequest.FromString(body).HasField("data_parallel_rank")
    assert "dp_rank" not in stream.summary()


def test_a_batch_needs_the_native_server(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(MODEL, [(ENGINE, 0)])
    stream, replies = send(gateway, {"model": MODEL, "prompt": ["a", "b"]})
    immediate = replies[-1].immediate_response
    assert immediate.status.code == 501
    assert stream.done and stream.pending_abort() is None


def test_bytes_that_are_no_processing_request_are_refused(gateway: _native.Gateway) -> None:
    stream = gateway.new_stream()
    with pytest.raises(ValueError, match="not a ProcessingRequest"):
        stream.process(b"\xff")  # a field tag cut off mid-varint
    assert not stream.done


def test_the_responses_api_needs_the_native_server(gateway: _native.Gateway) -> None:
    stream = gateway.new_stream()
    pairs = {":method": "GET", ":path": "/v1/responses/resp_1"}
    headers = core.HeaderMap(
        headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )
    message = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=headers, end_of_stream=True))
    (reply,) = [ep.ProcessingResponse.FromString(r) for r in stream.process(message.SerializeToString())]
    assert reply.immediate_response.status.code == 501
