"""Envoy's engines cluster served over EDS (state-of-the-world xDS) by extproc: one ClusterLoadAssignment,
`engines`, holding every engine the pools know (configured and discovered, probed or not, draining or
not), so that an Envoy whose engines cluster is EDS with the override_host policy can reach any engine
extproc names and follow its fallback list, while engines come and go.

An engine is in the assignment from the moment discovery finds it (before its first probe), so Envoy
knows it before the router may pick it; it leaves when discovery drops it. Every change is a new version
pushed to every open stream; Envoy's ACKs and NACKs need no answer (a NACK is logged).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import grpc
import structlog
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from extproc.setting_parsers import parse_host_port

log = structlog.get_logger("extproc.discovery")

CLUSTER = "engines"
ASSIGNMENT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def assignment(addresses: Iterable[str]) -> endpoint_pb2.ClusterLoadAssignment:
    """The engines cluster's endpoints: one per `ip:port` (`[v6]:port`)."""
    endpoints = []
    for address in addresses:
        host, port = parse_host_port(address)
        socket = address_pb2.SocketAddress(address=host, port_value=port)
        endpoint = endpoint_components_pb2.Endpoint(address=address_pb2.Address(socket_address=socket))
        endpoints.append(endpoint_components_pb2.LbEndpoint(endpoint=endpoint))
    locality = endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=endpoints)
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=CLUSTER, endpoints=[locality] if endpoints else [])


class EngineEndpoints(eds_pb2_grpc.EndpointDiscoveryServiceServicer):
    """The `engines` assignment, versioned; `set_engines` replaces it and wakes every stream."""

    def __init__(self) -> None:
        self._addresses: tuple[str, ...] = ()
        self.version = 0
        # One event per open stream, set on every change.
        self._streams: set[asyncio.Event] = set()

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._addresses

    def set_engines(self, addresses: Iterable[str]) -> None:
        wanted = tuple(sorted(set(addresses)))
        if wanted == self._addresses:
            return
        self._addresses = wanted
        self.version += 1
        for changed in self._streams:
            changed.set()

    def _response(self) -> discovery_pb2.DiscoveryResponse:
        response = discovery_pb2.DiscoveryResponse(
            version_info=str(self.version), type_url=ASSIGNMENT_TYPE, nonce=str(self.version)
        )
        response.resources.add().Pack(assignment(self._addresses))
        return response

    async def StreamEndpoints(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        asked = asyncio.Event()

        async def read() -> None:
            async for request in request_iterator:
                if request.HasField("error_detail"):
                    log.warning("Envoy refused the engines assignment", version=request.response_nonce,
                                error=request.error_detail.message)  # fmt: skip
                asked.set()

        changed = asyncio.Event()
        self._streams.add(changed)
        reader = asyncio.create_task(read())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asked.wait(), 30.0)  # Envoy asks first
            sent = -1
            while not reader.done():
                if sent != self.version:
                    sent = self.version
                    yield self._response()
                changed.clear()
                if sent == self.version:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 1.0)  # also notices a stream Envoy ended
        finally:
            self._streams.discard(changed)
            reader.cancel()


async def serve(endpoints: EngineEndpoints, listen: str) -> tuple[grpc.aio.Server, str]:
    """Serve EDS on `listen` (host:port or [v6]:port; port 0 for any); returns the server and its address."""
    server = grpc.aio.server()
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(endpoints, server)
    bound = server.add_insecure_port(listen)
    if bound == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    return server, f"{listen.rpartition(':')[0]}:{bound}"
