"""The control-plane RPCs of one engine, in whichever protocol it speaks (vLLM or SGLang).

Both protocols offer the same management calls (HealthCheck, GetModelInfo, GetServerInfo, GetLoads,
SubscribeKvEvents) under different service names and, partly, different messages. `detect_protocol`
finds out which one an engine serves by asking HealthCheck under each service name: a server that does
not implement a service answers UNIMPLEMENTED, so any other answer (healthy or not) identifies it.
`EngineClient` then reads each reply the way its protocol defines it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import grpc
from google.protobuf import struct_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang_pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sglang_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vllm_grpc

# The router's load type: what a GetLoads reply becomes here is what the router takes, field for field.
from extproc._native import EngineLoad

Protocol = Literal["vllm", "sglang"]
PROTOCOLS: tuple[Protocol, ...] = ("vllm", "sglang")
SERVICES: dict[Protocol, str] = {
    "vllm": "vllm.grpc.engine.VllmEngine",
    "sglang": "sglang.grpc.scheduler.SglangScheduler",
}


def configured_protocol(setting: str) -> Protocol | None:
    """A protocol setting as the protocol it names; None for "auto" (detect it)."""
    for protocol in PROTOCOLS:
        if setting == protocol:
            return protocol
    return None


class NoKnownProtocol(Exception):
    """The engine answered, but implements neither protocol's HealthCheck."""


def subscribe_method(protocol: Protocol) -> str:
    """The SubscribeKvEvents method path; both services stream common.proto's KvEventBatch."""
    return f"/{SERVICES[protocol]}/SubscribeKvEvents"


async def detect_protocol(channel: grpc.aio.Channel, timeout_s: float) -> Protocol:
    """The protocol whose HealthCheck the engine implements.

    Raises NoKnownProtocol when every service answers UNIMPLEMENTED, and the RPC error when the engine
    cannot be asked (unreachable, timeout): the caller tries again later.
    """
    for protocol in PROTOCOLS:
        health = _pb(protocol).HealthCheckRequest()
        method = channel.unary_unary(
            f"/{SERVICES[protocol]}/HealthCheck",
            request_serializer=type(health).SerializeToString,
            response_deserializer=None,
        )
        try:
            await method(health, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
            raise
        return protocol
    raise NoKnownProtocol(f"implements neither {' nor '.join(SERVICES.values())} (HealthCheck UNIMPLEMENTED)")


@dataclass(frozen=True)
class ModelFacts:
    """What the router needs to know of an engine at registration."""

    max_context: int | None
    # Tokens per KV block (vLLM block_size, SGLang page_size); 0 when the engine does not say.
    block_size: int
    # Data-parallel ranks, each with its own KV cache (vLLM data_parallel_size, SGLang dp_size); 1 when
    # DP is off or the engine does not say.
    dp_size: int = 1


def _pb(protocol: Protocol) -> Any:
    return vllm_pb if protocol == "vllm" else sglang_pb


class EngineClient:
    """HealthCheck, GetModelInfo, GetServerInfo and GetLoads of one engine in its own protocol."""

    def __init__(self, channel: grpc.aio.Channel, protocol: Protocol) -> None:
        self.protocol = protocol
        self._pb = _pb(protocol)
        stub = vllm_grpc.VllmEngineStub if protocol == "vllm" else sglang_grpc.SglangSchedulerStub
        self._stub: Any = stub(channel)

    async def healthy(self, timeout_s: float, *, wait_for_ready: bool = True) -> bool:
        # wait_for_ready: a channel between reconnect attempts waits (up to the timeout) rather than failing
        # at once, so an engine that just came back is not marked down by the tail of its outage. Without
        # it, an engine that refuses connections fails the check at once (UNAVAILABLE).
        reply = await self._stub.HealthCheck(
            self._pb.HealthCheckRequest(), timeout=timeout_s, wait_for_ready=wait_for_ready
        )
        return bool(reply.healthy)

    async def model_facts(self, timeout_s: float) -> ModelFacts:
        info = await self._stub.GetModelInfo(self._pb.GetModelInfoRequest(), timeout=timeout_s)
        server = await self._stub.GetServerInfo(self._pb.GetServerInfoRequest(), timeout=timeout_s)
        if self.protocol == "vllm":
            block_size = server.block_size
            dp_size = server.data_parallel_size
        else:
            # SGLang's GetServerInfo has no block size or DP fields; its server_args carry page_size, dp_size.
            block_size = _struct_int(server.server_args, "page_size")
            dp_size = _struct_int(server.server_args, "dp_size")
        return ModelFacts(
            max_context=info.max_context_length or None,
            block_size=max(block_size, 0),
            dp_size=max(dp_size, 1),
        )

    async def loads(self, timeout_s: float) -> EngineLoad:
        reply = await self._stub.GetLoads(self._pb.GetLoadsRequest(), timeout=timeout_s)
        return load_from_reply(reply)

    async def loads_by_rank(self, timeout_s: float) -> dict[int, EngineLoad]:
        reply = await self._stub.GetLoads(self._pb.GetLoadsRequest(), timeout=timeout_s)
        return loads_by_rank(reply)


def load_from_reply(reply: Any) -> EngineLoad:
    """One load from a GetLoadsResponse of either protocol.

    Both list a `SchedulerLoad` per data-parallel rank with the same field names: requests running and
    waiting add up over ranks, as do the admission window and the queued uncached prompt tokens; KV
    usage is the share of all ranks' KV tokens in use (the ranks' mean when their capacities are
    unknown). SGLang adds an `aggregate`, used only when it sends no per-rank loads. Fields an engine
    leaves unset read 0.
    """
    ranks = list(reply.loads)
    if not ranks:
        aggregate = getattr(reply, "aggregate", None)
        if aggregate is None or not reply.HasField("aggregate"):
            return EngineLoad(running=0, waiting=0, kv_usage=0.0, max_running=0)
        return EngineLoad(
            running=max(aggregate.total_running_reqs, 0),
            waiting=max(aggregate.total_waiting_reqs, 0),
            kv_usage=_fraction(aggregate.avg_token_usage),
            max_running=0,
        )
    capacity = sum(max(r.max_total_num_tokens, 0) for r in ranks)
    if capacity > 0 and all(r.max_total_num_tokens > 0 for r in ranks):
        usage = sum(_fraction(r.token_usage) * r.max_total_num_tokens for r in ranks) / capacity
    else:
        usage = sum(_fraction(r.token_usage) for r in ranks) / len(ranks)
    return EngineLoad(
        running=sum(max(r.num_running_reqs, 0) for r in ranks),
        waiting=sum(max(r.num_waiting_reqs, 0) for r in ranks),
        kv_usage=usage,
        max_running=sum(max(r.max_running_requests, 0) for r in ranks),
        waiting_uncached_tokens=sum(max(r.num_waiting_uncached_tokens, 0) for r in ranks),
    )


def loads_by_rank(reply: Any) -> dict[int, EngineLoad]:
    """Each data-parallel rank's own load from a GetLoadsResponse of either protocol, by `dp_rank`.

    Empty when the reply lists no per-rank loads (SGLang's `aggregate` alone says nothing of any one
    rank); a rank listed twice keeps its last entry; negative ranks are left out.
    """
    out: dict[int, EngineLoad] = {}
    for r in reply.loads:
        if r.dp_rank < 0:
            continue
        out[r.dp_rank] = EngineLoad(
            running=max(r.num_running_reqs, 0),
            waiting=max(r.num_waiting_reqs, 0),
            kv_usage=_fraction(r.token_usage),
            max_running=max(r.max_running_requests, 0),
            waiting_uncached_tokens=max(r.num_waiting_uncached_tokens, 0),
        )
    return out


def _fraction(value: float) -> float:
    return min(max(value, 0.0), 1.0) if value == value else 0.0  # NaN reads as 0


def _struct_int(struct: struct_pb2.Struct, key: str) -> int:
    value = struct.fields.get(key)
    if value is None or value.WhichOneof("kind") != "number_value":
        return 0
    return int(value.number_value)
