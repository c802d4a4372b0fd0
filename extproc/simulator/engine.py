"""One simulated vLLM engine: the `vllm.grpc.engine.VllmEngine` service over an `EngineCore`.

Message shapes follow vLLM's gRPC servicer (`responses`), checked against a real engine by the contract
suite (tests/contract). RPCs this class does not override answer UNIMPLEMENTED (the generated base class
does that): Embed and the profiler.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import NamedTuple

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from extproc.simulator import responses
from extproc.simulator.core import EngineCore, EngineStats, RecordedCall
from extproc.simulator.generate import serve
from extproc.simulator.model import ModelSpec
from extproc.simulator.options import DEFAULT_OPTIONS, SimOptions
from extproc.simulator.sampler import GenerationParams, requested_prompt_logprobs, resolve_params
from extproc.simulator.vocab import PlausibleVocab

logger = logging.getLogger(__name__)

__all__ = ["EngineStats", "Resolved", "VllmEngine", "resolve_request"]


class Resolved(NamedTuple):
    """What `admit` made of a Generate request."""

    prompt_ids: list[int]
    params: GenerationParams
    n: int
    rank: int | None  # the DP rank it is pinned to; None lets the engine balance


def pinned_rank(request: vllm_engine_pb2.GenerateRequest) -> int | None:
    return request.data_parallel_rank if request.HasField("data_parallel_rank") else None


def resolve_request(
    request: vllm_engine_pb2.GenerateRequest, core: EngineCore
) -> tuple[list[int], GenerationParams, int]:
    """Prompt ids, resolved parameters and n; a ValueError is the client's fault."""
    # The simulator has no tokenizer path: the gateway sends token ids, text is a caller bug.
    if request.WhichOneof("input") != "tokenized":
        raise ValueError("the simulator accepts tokenized input only (tokenized.input_ids)")
    prompt_ids = list(request.tokenized.input_ids)
    sampling = request.sampling_params
    params = resolve_params(sampling, core.spec, prompt_ids)
    n = sampling.n or 1
    if n > 1 and params.greedy:
        raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")
    if not core.fits(len(prompt_ids)):
        raise ValueError(f"the prompt ({len(prompt_ids)} tokens) cannot fit in the KV cache")
    # Choice i samples with seed + i (EngineCore.submit).
    plan = core.plan_output(prompt_ids, sampling, range(params.seed, params.seed + n))
    if plan is not None:
        params = replace(params, plan=plan)
    return prompt_ids, params, n


async def admit(
    core: EngineCore,
    request: vllm_engine_pb2.GenerateRequest,
    context: grpc.aio.ServicerContext,
    check: Callable[[list[int]], None] | None = None,
) -> Resolved:
    """Every Generate's first step, whatever the protocol: count it, fail it if a fault says so, check
    it (INVALID_ARGUMENT when the client is at fault, a pinned DP rank out of range included; `check`
    adds the protocol's own checks of the prompt ids); returns what `resolve_request` resolved and the
    pinned rank."""
    core.stats.generate_requests += 1
    core.last_receive = time.time()
    if core.options.record_calls:
        metadata = tuple((k, v) for k, v in context.invocation_metadata() or ())
        core.recorded.append(RecordedCall(request.request_id, metadata, context.time_remaining()))
    failure = core.faults.take_failure()
    if failure is not None:
        core.stats.faults += 1
        await context.abort(*failure)
    try:
        prompt_ids, params, n = resolve_request(request, core)
        if check is not None:
            check(prompt_ids)
        rank = pinned_rank(request)
        core.check_rank(rank)
        return Resolved(prompt_ids, params, n, rank)
    except ValueError as e:
        core.stats.rejected += 1
        logger.info("Generate %s rejected: %s", request.request_id, e)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        raise  # not reached: abort raises


class VllmEngine(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(
        self,
        spec: ModelSpec,
        vocab: PlausibleVocab,
        options: SimOptions = DEFAULT_OPTIONS,
        core: EngineCore | None = None,
    ) -> None:
        self.core = core or EngineCore(spec, vocab, options)
        self.port = 0  # set once the server hosting this engine has bound

    @property
    def spec(self) -> ModelSpec:
        return self.core.spec

    @property
    def options(self) -> SimOptions:
        return self.core.options

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    # --- Generate -------------------------------------------------------------------------------

    async def Generate(
        self, request: vllm_engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        core = self.core
        prompt_ids, params, n, rank = await admit(core, request, context)
        sampling = request.sampling_params
        # vLLM computes a prompt whose logprobs are asked for: it reads nothing from the prefix cache.
        cache_limit = 0 if requested_prompt_logprobs(sampling) is not None else None
        admitted = core.submit(request.request_id, prompt_ids, params, n, cache_limit, rank)
        messages = responses.VllmMessages(prompt_ids, sampling, core.vocab)
        async for response in serve(core, admitted, request.stream, context, messages):
            yield response

    # --- Abort ----------------------------------------------------------------------------------

    async def Abort(
        self, request: vllm_engine_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.AbortResponse:
        self.core.stats.abort_calls += 1
        self.core.abort(list(request.request_ids))
        return vllm_engine_pb2.AbortResponse()

    # --- Management -----------------------------------------------------------------------------

    async def HealthCheck(
        self, request: vllm_engine_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.HealthCheckResponse:
        await self.core.faults.delay_health_check()
        if self.core.faults.settings.unhealthy:
            return vllm_engine_pb2.HealthCheckResponse(healthy=False, message="Engine is not alive")
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")

    async def GetModelInfo(
        self, request: vllm_engine_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetModelInfoResponse:
        spec = self.spec
        return vllm_engine_pb2.GetModelInfoResponse(
            model_path=str(spec.model_dir),
            is_generation=True,
            max_context_length=spec.max_model_len,
            vocab_size=spec.vocab_size,
            supports_vision=False,
            served_model_name=spec.served_name,
            tokenizer_path=str(spec.model_dir),
            model_type=spec.model_type,
            architectures=spec.architectures,
            eos_token_ids=spec.eos_token_ids,
            pad_token_id=spec.pad_token_id,
            bos_token_id=spec.bos_token_id,
            max_req_input_len=spec.max_model_len,
            default_sampling_params_json=spec.default_sampling_params_json,
        )

    async def GetServerInfo(
        self, request: vllm_engine_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetServerInfoResponse:
        # vLLM's servicer fills these from the engine's config only: no counters, no server_type.
        return vllm_engine_pb2.GetServerInfoResponse(
            data_parallel_size=self.core.data_parallel_size,
            shm_namespace_id=shm_namespace_id(),
            kv_cache_dtype="auto",
            block_size=self.options.block_size,
            model_dtype="torch.bfloat16",
            max_num_seqs=self.options.max_num_seqs,
            multimodal_encoder_dtype="bfloat16",
            constrained_decoding_start="first_token",
        )

    async def GetLoads(
        self, request: vllm_engine_pb2.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetLoadsResponse:
        core = self.core
        ranks = core.ranks(request.dp_rank if request.HasField("dp_rank") else None)
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=_iso_now(),
            version=self.options.version,
            dp_rank_count=core.data_parallel_size,
            loads=[vllm_engine_pb2.SchedulerLoad(**core.load_fields(rank)) for rank in ranks],
        )

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        for chunk in await self.core.tokenizer_chunks():
            yield chunk

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in self.core.hub.subscribe(request, context):
            yield batch

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        return await flush_cache(self.core, request, context)


async def flush_cache(
    core: EngineCore, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
) -> common_pb2.FlushCacheResponse:
    """vLLM's servicer: retry until every rank's cache is idle within timeout_s (0: one attempt)."""
    timeout = request.timeout_s
    if not timeout >= 0 or timeout == float("inf"):
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details("timeout_s must be finite and non-negative")
        return common_pb2.FlushCacheResponse(success=False, message="Invalid timeout_s")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if core.flush_cache():
            return common_pb2.FlushCacheResponse(
                success=True, message="Local KV prefix cache flushed successfully"
            )
        if timeout == 0:
            return common_pb2.FlushCacheResponse(
                success=False, message="KV prefix cache reset refused; requests may be in flight"
            )
        if loop.time() >= deadline:
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            context.set_details("Flush cache timed out; the engine may still complete an issued reset")
            return common_pb2.FlushCacheResponse(success=False, message="Flush cache timed out")
        await asyncio.sleep(min(0.05, deadline - loop.time()))


def shm_namespace_id() -> str:
    """This host's /dev/shm identity (<boot_id>:<st_dev>), as vLLM's servicer advertises it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        return f"{boot_id}:{os.stat('/dev/shm').st_dev}"
    except OSError:
        return ""


def _iso_now() -> str:
    return datetime.now(UTC).isoformat()
