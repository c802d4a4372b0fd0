"""The data plane's side of the Gateway API Inference Extension's endpoint-picker protocol, written from the
protocol's description (docs/proposals/004-endpoint-picker-protocol) and Envoy's ext_proc API, with no
Envoy: one `ExtProcCall` is the `envoy.service.ext_proc.v3.ExternalProcessor/Process` stream a gateway
opens per HTTP request, and `pick`/`serve` play the gateway's part on it:

- request headers (with the subset hint in `metadata_context`, namespace `envoy.lb.subset_hint`, key
  `x-gateway-destination-endpoint-subset`), then the body in chunks (FULL_DUPLEX_STREAMED: each chunk
  its own message, the last with `end_of_stream`);
- the picker answers with an `ImmediateResponse` (no endpoint: 503, shed: 429, a bad request: 4xx), or
  with the destination: the `x-gateway-destination-endpoint` header mutation and the same value under
  `dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]`, plus the rewritten body (extproc
  turns the OpenAI request into the engine's gRPC call);
- the gateway sends the request to an engine of the list and reports the one that served with the
  response headers: `metadata_context["envoy.lb"]["x-gateway-destination-endpoint-served"]`.

The names come from the protocol text, not from extproc's own constants, so a rename on either side fails
here."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

# The protocol's names (GIE 004-endpoint-picker-protocol, v1.0.0).
DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
# The gRPC health services an endpoint picker serves.
LIVENESS, READINESS = "liveness", "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Envoy's attribute with the upstream that answered (extproc's fallback when the metadata is missing).
UPSTREAM_ADDRESS = "upstream.address"

# How long one stream may take end to end: a hung picker fails the test instead of hanging it.
CALL_TIMEOUT_S = 30.0


def _header_map(headers: dict[str, str]) -> core.HeaderMap:
    return core.HeaderMap(headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()])


def _set_headers(mutation: ep.HeaderMutation) -> dict[str, str]:
    return {
        o.header.key: (o.header.raw_value or o.header.value.encode()).decode() for o in mutation.set_headers
    }


def subset_metadata(addresses: Sequence[str] | str) -> core.Metadata:
    """The subset hint as a filter before the picker writes it: a list of `ip:port` strings, or (the
    other form the brief asks for) one comma-separated string."""
    hint = struct_pb2.Struct()
    hint.update({SUBSET_KEY: addresses if isinstance(addresses, str) else list(addresses)})
    return core.Metadata(filter_metadata={SUBSET_NAMESPACE: hint})


def served_metadata(address: str) -> core.Metadata:
    served = struct_pb2.Struct()
    served.update({SERVED_KEY: address})
    return core.Metadata(filter_metadata={LB_NAMESPACE: served})


class ExtProcCall:
    """One Process stream, driven synchronously: `send` queues a message, `reply` waits for the next."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._outbox: queue.Queue[ep.ProcessingRequest | None] = queue.Queue()
        self._replies: Any = ep_grpc.ExternalProcessorStub(channel).Process(
            iter(self._outbox.get, None), timeout=CALL_TIMEOUT_S
        )

    def send(self, request: ep.ProcessingRequest) -> None:
        self._outbox.put(request)

    def reply(self) -> ep.ProcessingResponse:
        reply: ep.ProcessingResponse = next(self._replies)
        return reply

    def finish(self) -> list[ep.ProcessingResponse]:
        """Half-close and read what is left until the picker ends the stream."""
        self._outbox.put(None)
        return list(self._replies)

    def cancel(self) -> None:
        """The client went away: Envoy resets the stream."""
        self._replies.cancel()


@dataclass
class Picked:
    """The picker's answer to a request: an immediate response, or a destination."""

    status: int | None = None  # set for an ImmediateResponse
    body: bytes = b""  # the immediate response's body, or the rewritten request body
    header_destination: str | None = None
    metadata_destination: str | None = None
    headers: dict[str, str] = field(default_factory=dict)  # the request-headers mutation's set headers
    removed: list[str] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        """The destination list: the primary, then the fallbacks in order."""
        return (self.header_destination or "").split(",")

    def error(self) -> dict[str, Any]:
        """The immediate response's OpenAI-style error object."""
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


def request_headers(
    path: str,
    headers: dict[str, str] | None = None,
    *,
    subset: Sequence[str] | str | None = None,
    method: str = "POST",
    end_of_stream: bool = False,
) -> ep.ProcessingRequest:
    all_headers = {":method": method, ":path": path, ":authority": "gateway", ":scheme": "http"}
    all_headers |= {"content-type": "application/json", **(headers or {})}
    return ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(headers=_header_map(all_headers), end_of_stream=end_of_stream),
        metadata_context=subset_metadata(subset) if subset is not None else None,
    )


def body_chunks(body: bytes, chunk_size: int) -> Iterator[ep.ProcessingRequest]:
    """The body as FULL_DUPLEX_STREAMED sends it: `chunk_size` bytes a message, the last ending it."""
    pieces = [body[i : i + chunk_size] for i in range(0, len(body), chunk_size)] or [b""]
    for i, piece in enumerate(pieces):
        yield ep.ProcessingRequest(request_body=ep.HttpBody(body=piece, end_of_stream=i == len(pieces) - 1))


def pick(
    call: ExtProcCall,
    body: bytes | dict[str, Any],
    *,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
    subset: Sequence[str] | str | None = None,
    chunk_size: int = 1 << 20,
) -> Picked:
    """Send one request's headers and body; read the picker's decision (and the rewritten body)."""
    # UTF-8 as clients send it (not \u escapes): small chunks then cut characters in the middle.
    raw = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    call.send(request_headers(path, headers, subset=subset))
    for chunk in body_chunks(raw, chunk_size):
        call.send(chunk)
    first = call.reply()
    kind = first.WhichOneof("response")
    if kind == "immediate_response":
        answer = first.immediate_response
        return Picked(status=answer.status.code, body=answer.body)
    assert kind == "request_headers", f"the picker answered the request headers with {kind}"
    mutation = first.request_headers.response.header_mutation
    metadata = first.dynamic_metadata if first.HasField("dynamic_metadata") else None
    lb = metadata.fields[LB_NAMESPACE].struct_value if metadata is not None else None
    picked = Picked(
        headers=_set_headers(mutation),
        removed=list(mutation.remove_headers),
        metadata_destination=lb.fields[DESTINATION_HEADER].string_value if lb else None,
    )
    picked.header_destination = picked.headers.get(DESTINATION_HEADER)
    # The rewritten body streams back, chunk by chunk, until its end.
    while True:
        reply = call.reply()
        assert reply.WhichOneof("response") == "request_body", reply
        chunk = reply.request_body.response.body_mutation.streamed_response
        picked.body += chunk.body
        if chunk.end_of_stream:
            return picked


def grpc_message(framed: bytes) -> bytes:
    """The one message of a gRPC-framed body (a 5-byte prefix: compressed flag, big-endian length)."""
    assert framed[0] == 0, "compressed gRPC message"
    length = int.from_bytes(framed[1:5], "big")
    assert len(framed) == 5 + length, "one message expected"
    return framed[5:]


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def response_headers(served: str | None, *, via: str = "metadata") -> ep.ProcessingRequest:
    """The engine's response headers as the gateway forwards them, naming the engine that served:
    `via="metadata"` as the protocol says, `via="attribute"` as Envoy's `upstream.address` attribute."""
    headers = ep.HttpHeaders(headers=_header_map({":status": "200", "content-type": "application/grpc"}))
    request = ep.ProcessingRequest(response_headers=headers)
    if served is not None and via == "metadata":
        request.metadata_context.CopyFrom(served_metadata(served))
    elif served is not None:
        attributes = struct_pb2.Struct()
        attributes.update({UPSTREAM_ADDRESS: served})
        request.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    return request


def engine_answer(
    call: ExtProcCall, messages: Iterator[bytes], served: str | None, via: str = "metadata"
) -> tuple[int, bytes]:
    """Forward an engine's answer (its response messages) through the picker as the gateway does;
    the client's status and body."""
    call.send(response_headers(served, via=via))
    for message in messages:
        call.send(ep.ProcessingRequest(response_body=ep.HttpBody(body=grpc_frame(message))))
    trailers = _header_map({"grpc-status": "0"})
    call.send(ep.ProcessingRequest(response_trailers=ep.HttpTrailers(trailers=trailers)))
    replies = call.finish()
    status = 0
    body = b""
    for reply in replies:
        kind = reply.WhichOneof("response")
        if kind == "response_headers":
            status = int(_set_headers(reply.response_headers.response.header_mutation)[":status"])
        elif kind == "response_body":
            body += reply.response_body.response.body_mutation.streamed_response.body
    return status, body
