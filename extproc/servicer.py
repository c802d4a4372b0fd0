"""The Envoy ext_proc servicer: one bidi stream per HTTP request, bytes in and bytes out.

Each `ProcessingRequest` crosses into the native state machine once, as raw bytes, and comes back as
the serialized replies to send; protobuf parsing, templating, tokenizing and detokenizing all happen
there with the GIL released. This loop only moves bytes and runs the end-of-stream bookkeeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import structlog

from extproc import _native
from extproc.pool import EnginePool

log = structlog.get_logger("extproc.servicer")

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExternalProcessor:
    def __init__(self, gateway: _native.Gateway, pool: EnginePool) -> None:
        self._gateway = gateway
        self._pool = pool

    async def process(
        self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        stream = self._gateway.new_stream()
        try:
            async for message in messages:
                for reply in stream.process(message):
                    yield reply
        finally:
            # Runs on normal end, on Envoy resetting the stream (client gone) and on cancellation.
            pending = stream.pending_abort()
            if pending is not None:
                self._pool.abort_soon(*pending)
            summary = stream.summary()
            if pending is not None:
                log.info("client went away; engine request aborted", **summary)
            elif summary["status"] >= 500:
                log.warning("request failed", **summary)

    def handler(self) -> grpc.GenericRpcHandler:
        # No (de)serializers: messages stay bytes end to end.
        return grpc.method_handlers_generic_handler(
            SERVICE, {"Process": grpc.stream_stream_rpc_method_handler(self.process)}
        )
