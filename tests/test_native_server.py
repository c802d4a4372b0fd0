"""The native ext_proc server over real sockets, with a grpc.aio client playing Envoy's part (the real
ext_proc protos from xds-protos) and, where a request reaches an engine, the simulated vLLM engine."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from extproc import _native, contracts, server
from extproc.config import Settings
from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from tests.conftest import DEFAULT_MODEL, default_gateway

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
MODEL = DEFAULT_MODEL


@pytest.fixture(scope="module")
def gateway() -> _native.Gateway:
    gateway = default_gateway(MODEL)
    return gateway


@pytest.fixture(params=["tcp", "unix"])
def listen(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "127.0.0.1:0" if request.param == "tcp" else f"unix:{tmp_path / 'extproc.sock'}"


@pytest.fixture
def native(gateway: _native.Gateway, listen: str) -> Iterator[_native.ExtProcServer]:
    ext = _native.ExtProcServer(gateway, listen)
    ext.start()
    yield ext
    ext.stop(1.0)


@pytest.fixture
async def engines(gateway: _native.Gateway) -> AsyncIterator[SimCluster]:
    # 20 ms per token: a 200-token generation is still running when the client walks away.
    cluster = await start_engines(default_model_dir(), count=1, base_port=0, options=SimOptions(itl_ms=20.0))
    gateway.set_endpoints(MODEL, [(address, 0) for address in cluster.addresses])
    yield cluster
    gateway.set_endpoints(MODEL, [])
    await cluster.stop(grace=0)


def headers(**pairs: str) -> ep.HttpHeaders:
    return ep.HttpHeaders(
        headers=core.HeaderMap(
            headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        )
    )


def header_values(mutation: ep.HeaderMutation) -> dict[str, str]:
    return {
        o.header.key: (o.header.raw_value or o.header.value.encode()).decode() for o in mutation.set_headers
    }


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class Envoy:
    """Envoy's side of one ext_proc stream, over a real channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = ep_grpc.ExternalProcessorStub(channel).Process()

    async def send(self, **request: object) -> None:
        await self.call.write(ep.ProcessingRequest(**request))  # type: ignore[arg-type]

    async def reply(self) -> ep.ProcessingResponse:
        reply = await asyncio.wait_for(self.call.read(), 10)
        assert reply is not grpc.aio.EOF, "the stream ended early"
        return reply  # type: ignore[return-value]

    async def post(self, path: str, body: dict[str, object], request_id: str) -> None:
        await self.send(
            request_headers=headers(**{":method": "POST", ":path": path, "x-request-id": request_id})
        )
        await self.send(request_body=ep.HttpBody(body=json.dumps(body).encode(), end_of_stream=True))

    async def routed(self) -> tuple[str, bytes]:
        """The routing decision and the engine request that replaces the body."""
        route = await self.reply()
        assert route.WhichOneof("response") == "request_headers"
        mutation = header_values(route.request_headers.response.header_mutation)
        assert mutation[":path"] == GENERATE
        assert mutation["content-type"] == "application/grpc"
        body = b""
        while True:
            chunk = (await self.reply()).request_body.response.body_mutation.streamed_response
            body += chunk.body
            if chunk.end_of_stream:
                return mutation[contracts.DESTINATION_HEADER], body


def channel_for(address: str) -> grpc.aio.Channel:
    # gRPC C-core sends a unix socket's path as :authority, which is no valid authority and HTTP/2
    # servers other than its own reset the stream; Envoy sends its cluster name.
    options = [("grpc.default_authority", "localhost")] if address.startswith("unix:") else []
    return grpc.aio.insecure_channel(address, options=options)


async def wait_for(predicate: Callable[[], bool], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_models_are_listed_at_once(native: _native.ExtProcServer) -> None:
    assert native.address is not None
    async with channel_for(native.address) as channel:
        envoy = Envoy(channel)
        objective = {contracts.OBJECTIVE_HEADER: "batch"}
        request = headers(**{":method": "GET", ":path": "/v1/models", "x-request-id": "m-1"}, **objective)
        request.end_of_stream = True
        await envoy.send(request_headers=request)
        answer = (await envoy.reply()).immediate_response
        await envoy.call.done_writing()
        assert await envoy.call.code() == grpc.StatusCode.OK
    assert answer.status.code == 200
    assert [m["id"] for m in json.loads(answer.body)["data"]] == [MODEL]
    assert await wait_for(lambda: native.stats()["streams_finished"] == 1)
    [summary] = native.take_summaries()
    assert summary["request_id"] == "m-1" and summary["status"] == 200 and summary["aborted"] is False
    assert summary["objective"] == "batch"


async def test_a_chat_request_is_routed_to_the_engine_and_its_answer_translated(
    native: _native.ExtProcServer, engines: SimCluster
) -> None:
    assert native.address is not None
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    async with channel_for(native.address) as channel, channel_for(engines.addresses[0]) as engine:
        envoy = Envoy(channel)
        await envoy.post("/v1/chat/completions", body, "c-1")
        endpoint, framed = await envoy.routed()
        assert endpoint == engines.addresses[0]
        generate = vllm.GenerateRequest.FromString(framed[5:])
        # The engine's id is extproc's own, never the client's x-request-id (engines abort by id).
        assert generate.request_id.startswith("extproc-") and generate.request_id != "c-1"
        assert generate.sampling_params.max_tokens == 4
        assert len(generate.tokenized.input_ids) > 0

        # Envoy forwards the rewritten request and streams the engine's answer back through ext_proc.
        await envoy.send(response_headers=headers(**{":status": "200", "content-type": "application/grpc"}))
        async for message in engine.unary_stream(GENERATE)(framed[5:]):
            await envoy.send(response_body=ep.HttpBody(body=grpc_frame(message)))
        trailers = headers(**{"grpc-status": "0"}).headers
        await envoy.send(response_trailers=ep.HttpTrailers(trailers=trailers))
        client_headers = await envoy.reply()
        final = await envoy.reply()
        last = await envoy.reply()
        await envoy.call.done_writing()
        assert await envoy.call.code() == grpc.StatusCode.OK

    status = header_values(client_headers.response_headers.response.header_mutation)
    assert status[":status"] == "200" and status["content-type"] == "application/json"
    answer = json.loads(final.response_body.response.body_mutation.streamed_response.body)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] == 4
    assert "grpc-status" in last.response_trailers.header_mutation.remove_headers
    assert await wait_for(lambda: native.stats()["streams_finished"] == 1)
    [summary] = native.take_summaries()
    assert summary["completion_tokens"] == 4 and summary["endpoint"] == endpoint and not summary["aborted"]
    assert engines.engines[0].stats.abort_calls == 0


@pytest.mark.parametrize("goes_away", ["reset", "half_close"])
async def test_a_client_gone_mid_stream_makes_the_server_abort_the_engine_request(
    native: _native.ExtProcServer, engines: SimCluster, goes_away: str
) -> None:
    assert native.address is not None
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body |= {"max_tokens": 200, "ignore_eos": True}
    engine_stats = engines.engines[0].stats
    async with channel_for(native.address) as channel, channel_for(engines.addresses[0]) as engine:
        envoy = Envoy(channel)
        await envoy.post("/v1/chat/completions", body, f"gone-{goes_away}")
        _, framed = await envoy.routed()
        generation = engine.unary_stream(GENERATE)(framed[5:])
        await envoy.send(response_headers=headers(**{":status": "200", "content-type": "application/grpc"}))
        await envoy.send(response_body=ep.HttpBody(body=grpc_frame(await generation.read())))
        assert (await envoy.reply()).WhichOneof("response") == "response_headers"
        first = (await envoy.reply()).response_body.response.body_mutation.streamed_response.body
        assert first.startswith(b"data: ")  # the stream is flowing

        # The client goes away: Envoy resets the ext_proc stream, or closes it.
        if goes_away == "reset":
            envoy.call.cancel()
        else:
            await envoy.call.done_writing()
        assert await wait_for(lambda: engine_stats.abort_calls == 1), "no Abort reached the engine"
        assert await wait_for(lambda: engine_stats.active == 0), "the engine kept generating"
        generation.cancel()
    assert engine_stats.completed == 0
    assert await wait_for(lambda: native.stats()["aborts_sent"] == 1)
    assert native.stats()["aborts_failed"] == 0
    [summary] = native.take_summaries()
    assert summary["aborted"] is True and summary["request_id"] == f"gone-{goes_away}"


async def test_stop_lets_streams_finish_within_the_grace_then_cancels_them(
    native: _native.ExtProcServer,
) -> None:
    assert native.address is not None
    async with channel_for(native.address) as channel:
        envoy = Envoy(channel)
        request = {"request_headers": headers(**{":method": "POST", ":path": "/v1/chat/completions"})}
        await envoy.send(**request)  # the body never comes
        assert await wait_for(lambda: native.stats()["streams_started"] == 1)
        began = time.monotonic()
        await asyncio.to_thread(native.stop, 0.3)
        took = time.monotonic() - began
        assert 0.3 <= took < 3.0
        assert await envoy.call.code() == grpc.StatusCode.UNAVAILABLE
    assert native.address is None
    assert native.stats()["streams_finished"] == 1


def test_the_server_rejects_what_it_cannot_serve(gateway: _native.Gateway, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        _native.ExtProcServer(gateway, "127.0.0.1:0", worker_threads=0)
    with pytest.raises(OSError):
        _native.ExtProcServer(gateway, "no port").start()
    (tmp_path / "file").write_text("not a socket")
    with pytest.raises(OSError):
        _native.ExtProcServer(gateway, f"unix:{tmp_path / 'file'}").start()
    ext = _native.ExtProcServer(gateway, "127.0.0.1:0", worker_threads=2)
    address = ext.start()
    with pytest.raises(RuntimeError):
        ext.start()
    ext.stop(0)
    assert ext.start() != ""  # a stopped server starts again (on a new free port)
    ext.stop(0)
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")


async def test_start_serves_the_configured_model_on_a_unix_socket(tmp_path: Path) -> None:
    cluster = await start_engines(default_model_dir(), count=1, base_port=0)
    sock = tmp_path / "gw.sock"
    settings = Settings(listen=f"unix:{sock}", engines=tuple(f"grpc://{a}" for a in cluster.addresses))
    running = await server.start(settings, engine_wait_s=10)
    try:
        assert running.address == f"unix:{sock}" and sock.exists()
        assert running.gateway.endpoints(running.model) == cluster.addresses
        async with channel_for(running.address) as channel:
            envoy = Envoy(channel)
            request = headers(**{":method": "GET", ":path": "/v1/models"})
            request.end_of_stream = True
            await envoy.send(request_headers=request)
            assert (await envoy.reply()).immediate_response.status.code == 200
    finally:
        await running.stop(grace=1)
        await cluster.stop(grace=0)
    assert not sock.exists()
    assert running.server.address is None
