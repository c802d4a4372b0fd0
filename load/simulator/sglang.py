"""One simulated SGLang engine: `sglang.grpc.scheduler.SglangScheduler` over the same `EngineCore`.

The differences from the vLLM protocol, as SGLang's servicer answers (smg-grpc-servicer): every response
names its request; stream chunks carry the new tokens with cumulative counts (`completion_tokens` is the
total so far), and the stream's `complete` repeats the last chunk's tokens with the total; sampling fields
are `max_new_tokens`/`min_new_tokens`; Abort takes one id and says whether it succeeded; GetServerInfo
describes the server as `server_args`/`scheduler_info` structs; GetLoads adds an aggregate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
from google.protobuf import struct_pb2, timestamp_pb2
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    vllm_engine_pb2,
)

from load.simulator.core import EngineCore, EngineStats, Request
from load.simulator.engine import admit, flush_cache, step_deltas
from load.simulator.responses import Finish

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.0"


def _as_vllm(request: sglang_scheduler_pb2.GenerateRequest) -> vllm_engine_pb2.GenerateRequest:
    """The same request in vLLM's terms, so validation and sampling are shared."""
    source = request.sampling_params
    params = vllm_engine_pb2.SamplingParams(
        min_tokens=source.min_new_tokens,
        stop=list(source.stop),
        stop_token_ids=list(source.stop_token_ids),
        ignore_eos=source.ignore_eos,
        n=source.n,
    )
    if source.HasField("max_new_tokens"):
        params.max_tokens = source.max_new_tokens
    # SGLang's temperature is plain: 0 means greedy, which refuses n > 1 the same way.
    if source.temperature or source.n > 1:
        params.temperature = source.temperature
    converted = vllm_engine_pb2.GenerateRequest(
        request_id=request.request_id, sampling_params=params, stream=request.stream
    )
    if request.HasField("tokenized"):
        converted.tokenized.input_ids.extend(request.tokenized.input_ids)
    return converted


class SglangEngine(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.port = 0

    @property
    def stats(self) -> EngineStats:
        return self.core.stats

    async def Generate(
        self, request: sglang_scheduler_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sglang_scheduler_pb2.GenerateResponse]:
        core = self.core
        prompt_ids, params, n = await admit(core, _as_vllm(request), context)
        admitted = core.submit(request.request_id, prompt_ids, params, n)
        cancelled = True
        try:
            async for response in self._outputs(request, admitted, len(prompt_ids), n, context):
                yield response
            cancelled = False
        finally:
            core.release(admitted, cancelled=cancelled and not admitted.faulted)

    async def _outputs(
        self,
        request: sglang_scheduler_pb2.GenerateRequest,
        admitted: Request,
        prompt_len: int,
        n: int,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[sglang_scheduler_pb2.GenerateResponse]:
        core = self.core
        mailbox = admitted.mailbox
        outputs: list[list[int]] = [[] for _ in range(n)]
        finishes: list[Finish | None] = [None] * n
        die_after = core.faults.settings.die_after_tokens
        sent = 0
        while any(f is None for f in finishes):
            await mailbox.wait()
            for index, tokens, step in mailbox.take():
                if die_after is not None and sent + len(tokens) > die_after:
                    core.stats.faults += 1
                    admitted.faulted = True
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "engine died mid-stream (injected)")
                sent += len(tokens)
                cached = mailbox.cached[index]
                deltas = step_deltas(tokens, step)
                for delta in deltas:
                    outputs[index].extend(delta)
                    if request.stream:
                        yield self._chunk(
                            request.request_id, delta, prompt_len, len(outputs[index]), cached, index
                        )
                if step is None:
                    continue
                finishes[index] = Finish.of(step)
                if request.stream:
                    yield self._complete(
                        request.request_id,
                        deltas[-1],
                        prompt_len,
                        len(outputs[index]),
                        cached,
                        index,
                        finishes[index],
                    )
        if not request.stream:
            for index in range(n):
                ids = outputs[index]
                yield self._complete(
                    request.request_id,
                    ids,
                    prompt_len,
                    len(ids),
                    mailbox.cached[index],
                    index,
                    finishes[index],
                )
        reasons = [f.reason for f in finishes if f is not None]
        core.finished.update(reasons)
        if "abort" in reasons:
            core.stats.aborts += 1
        else:
            core.stats.completed += 1

    @staticmethod
    def _chunk(
        request_id: str, tokens: list[int], prompt_len: int, total: int, cached: int, index: int
    ) -> sglang_scheduler_pb2.GenerateResponse:
        return sglang_scheduler_pb2.GenerateResponse(
            request_id=request_id,
            chunk=sglang_scheduler_pb2.GenerateStreamChunk(
                token_ids=tokens,
                prompt_tokens=prompt_len,
                completion_tokens=total,
                cached_tokens=cached,
                index=index,
            ),
        )

    @staticmethod
    def _complete(
        request_id: str, ids: list[int], prompt_len: int, total: int, cached: int, index: int, finish: Finish
    ) -> sglang_scheduler_pb2.GenerateResponse:
        message = sglang_scheduler_pb2.GenerateComplete(
            output_ids=ids,
            finish_reason=finish.reason,
            prompt_tokens=prompt_len,
            completion_tokens=total,
            cached_tokens=cached,
            index=index,
        )
        if finish.matched_token_id is not None:
            message.matched_token_id = finish.matched_token_id
        elif finish.matched_stop_str is not None:
            message.matched_stop_str = finish.matched_stop_str
        return sglang_scheduler_pb2.GenerateResponse(request_id=request_id, complete=message)

    async def Abort(
        self, request: sglang_scheduler_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.AbortResponse:
        self.core.stats.abort_calls += 1
        self.core.abort([request.request_id])
        return sglang_scheduler_pb2.AbortResponse(success=True, message="")

    async def HealthCheck(
        self, request: sglang_scheduler_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.HealthCheckResponse:
        if self.core.faults.settings.unhealthy:
            return sglang_scheduler_pb2.HealthCheckResponse(healthy=False, message="Engine is not alive")
        return sglang_scheduler_pb2.HealthCheckResponse(healthy=True, message="Health check passed")

    async def GetModelInfo(
        self, request: sglang_scheduler_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.GetModelInfoResponse:
        spec = self.core.spec
        return sglang_scheduler_pb2.GetModelInfoResponse(
            model_path=str(spec.model_dir),
            tokenizer_path=str(spec.model_dir),
            is_generation=True,
            preferred_sampling_params="",
            weight_version="default",
            served_model_name=spec.served_name,
            max_context_length=spec.max_model_len,
            vocab_size=spec.vocab_size,
            supports_vision=False,
            model_type=spec.model_type,
            eos_token_ids=spec.eos_token_ids,
            pad_token_id=spec.pad_token_id,
            bos_token_id=spec.bos_token_id,
            max_req_input_len=spec.max_model_len - 1,
            architectures=spec.architectures,
            default_sampling_params_json=spec.default_sampling_params_json,
        )

    async def GetServerInfo(
        self, request: sglang_scheduler_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.GetServerInfoResponse:
        core = self.core
        options = core.options
        server_args = struct_pb2.Struct()
        server_args.update(
            {
                "model_path": str(core.spec.model_dir),
                "served_model_name": core.spec.served_name,
                "page_size": options.block_size,
                "max_running_requests": options.max_num_seqs,
                "chunked_prefill_size": options.max_num_batched_tokens,
                "context_length": core.spec.max_model_len,
                "disable_radix_cache": False,
            }
        )
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update(
            {"max_total_num_tokens": core.max_total_tokens, "max_req_input_len": core.spec.max_model_len - 1}
        )
        started = timestamp_pb2.Timestamp()
        started.FromSeconds(int(core.started))
        return sglang_scheduler_pb2.GetServerInfoResponse(
            server_args=server_args,
            scheduler_info=scheduler_info,
            active_requests=core.stats.active,
            is_paused=False,
            last_receive_timestamp=core.last_receive,
            uptime_seconds=time.time() - core.started,
            sglang_version=SGLANG_VERSION,
            server_type="grpc",
            start_time=started,
            max_total_num_tokens=core.max_total_tokens,
        )

    async def GetLoads(
        self, request: sglang_scheduler_pb2.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.GetLoadsResponse:
        fields = self.core.load_fields()
        load = sglang_scheduler_pb2.SchedulerLoad(**fields)
        aggregate = sglang_scheduler_pb2.AggregateMetrics(
            total_running_reqs=load.num_running_reqs,
            total_waiting_reqs=load.num_waiting_reqs,
            total_reqs=load.num_total_reqs,
            avg_token_usage=load.token_usage,
            avg_throughput=load.gen_throughput,
            avg_utilization=load.utilization,
        )
        return sglang_scheduler_pb2.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=SGLANG_VERSION,
            dp_rank_count=1,
            loads=[load],
            aggregate=aggregate,
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
