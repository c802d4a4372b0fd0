"""extproc's EDS server: Envoy's engines cluster as a ClusterLoadAssignment, pushed on every change."""

from __future__ import annotations

import asyncio

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from extproc.discovery import eds


def _hosts(response: discovery_pb2.DiscoveryResponse) -> list[tuple[str, int]]:
    (resource,) = response.resources
    loaded = endpoint_pb2.ClusterLoadAssignment()
    assert resource.Unpack(loaded) and loaded.cluster_name == "engines"
    return [
        (e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
        for locality in loaded.endpoints
        for e in locality.lb_endpoints
    ]


async def test_a_stream_gets_the_engines_then_every_change() -> None:
    endpoints = eds.EngineEndpoints()
    endpoints.set_engines(["10.0.0.2:8001", "[fd00::1]:8001"])
    server, address = await eds.serve(endpoints, "127.0.0.1:0")
    requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

    async def outgoing():  # type: ignore[no-untyped-def]
        while (request := await requests.get()) is not None:
            yield request

    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stream = eds_pb2_grpc.EndpointDiscoveryServiceStub(channel).StreamEndpoints(outgoing())
            await requests.put(
                discovery_pb2.DiscoveryRequest(type_url=eds.ASSIGNMENT_TYPE, resource_names=["engines"])
            )
            first = await asyncio.wait_for(stream.read(), 5)
            assert first.type_url == eds.ASSIGNMENT_TYPE and first.version_info == "1"
            assert _hosts(first) == [("10.0.0.2", 8001), ("fd00::1", 8001)]
            # The ACK needs no answer; the same set again is no change.
            await requests.put(discovery_pb2.DiscoveryRequest(version_info="1", response_nonce=first.nonce))
            endpoints.set_engines(["[fd00::1]:8001", "10.0.0.2:8001"])
            endpoints.set_engines(["10.0.0.3:8001"])
            second = await asyncio.wait_for(stream.read(), 5)
            assert second.version_info == "2" and _hosts(second) == [("10.0.0.3", 8001)]
            endpoints.set_engines([])
            assert _hosts(await asyncio.wait_for(stream.read(), 5)) == []
            await requests.put(None)
    finally:
        await server.stop(0)
