"""One simulated SGLang engine: `sglang.grpc.scheduler.SglangScheduler` over the same `EngineCore`.

The differences from the vLLM protocol, as SGLang's servicer answers (smg-grpc-servicer): every response
names its request; stream chunks carry the new tokens with cumulative counts (`completion_tokens` is the
total so far), and the stream's `complete` repeats the last chunk's tokens with the total; sampling fields
are `max_new_tokens`/`min_new_tokens`; Abort takes one id and says whether it succeeded; GetServerInfo
describes the server as `server_args`/`scheduler_info` structs; GetLoads adds an aggregate.

Logprobs (`return_logprob`), as SGLang's scheduler and servicer fill them: `output_logprobs` holds each
token's logprob and, with `top_logprobs_num` > 0, the step's likeliest tokens sorted most likely first
(the sampled token only where it ranks); chunks carry their delta's, a stream's `complete` repeats the
last chunk's, a non-streamed `complete` carries the whole output's. With `logprob_start_len` >= 0 the
prompt from that position gets `input_logprobs` (its first entry without a value), on each choice's first
chunk or its non-streamed `complete`, and the prefix cache is read no further than that position; -1 asks
for none, a start at or past the prompt's end is refused.
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

from extproc.simulator.core import EngineCore, EngineStats
from extproc.simulator.engine import admit, flush_cache
from extproc.simulator.generate import serve
from extproc.simulator.logprobs import Ranking, TokenLogprob
from extproc.simulator.responses import Finish
from extproc.simulator.vocab import PlausibleVocab

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.0"
# SGLang's constraint oneof -> vLLM's field of the same meaning (constraints.py honours vLLM's).
CONSTRAINT_FIELDS = {
    "regex": "regex",
    "json_schema": "json_schema",
    "ebnf_grammar": "grammar",
    "structural_tag": "structural_tag",
}


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
    params.temperature = source.temperature
    if request.return_logprob:
        params.logprobs = max(request.top_logprobs_num, 0)
    constraint = source.WhichOneof("constraint")
    if constraint is not None:
        setattr(params, CONSTRAINT_FIELDS[constraint], getattr(source, constraint))
    converted = vllm_engine_pb2.GenerateRequest(
        request_id=request.request_id, sampling_params=params, stream=request.stream
    )
    if request.HasField("tokenized"):
        converted.tokenized.input_ids.extend(request.tokenized.input_ids)
    if request.HasField("data_parallel_rank"):
        converted.data_parallel_rank = request.data_parallel_rank
    return converted


def input_logprob_start(request: sglang_scheduler_pb2.GenerateRequest) -> int | None:
    """Where the prompt's logprobs start, None when the request asks for none."""
    if not request.return_logprob or request.logprob_start_len < 0:
        return None
    return request.logprob_start_len


def check_logprob_start(start: int | None, prompt_len: int) -> None:
    if start is not None and start >= prompt_len:
        raise ValueError(
            f"logprob_start_len={start} is higher than the number of input tokens {prompt_len}. "
            "Please use a smaller logprob_start_len."
        )


def _top(entry: TokenLogprob) -> sglang_scheduler_pb2.TopLogProbs:
    return sglang_scheduler_pb2.TopLogProbs(
        token_ids=[t for t, _ in entry.top], values=[v for _, v in entry.top]
    )


class SglangMessages:
    """Generate's messages for one SGLang request (`generate.Messages`)."""

    def __init__(
        self,
        request: sglang_scheduler_pb2.GenerateRequest,
        prompt_ids: list[int],
        start: int | None,
        vocab: PlausibleVocab,
    ) -> None:
        self.request_id = request.request_id
        self.prompt_ids = prompt_ids
        self.logprobs = request.return_logprob
        self.top = max(request.top_logprobs_num, 0)
        self.start = start
        self.vocab = vocab
        self._input_sent: set[int] = set()  # choices whose first chunk went out
        self._last_input: dict[int, sglang_scheduler_pb2.InputLogProbs] = {}
        self._prompt_message: sglang_scheduler_pb2.InputLogProbs | None = None

    def _output(
        self, tokens: list[int], entries: list[TokenLogprob]
    ) -> sglang_scheduler_pb2.OutputLogProbs | None:
        if not self.logprobs or not tokens:
            return None
        return sglang_scheduler_pb2.OutputLogProbs(
            token_logprobs=[e.logprob for e in entries],
            token_ids=tokens,
            top_logprobs=[_top(e) for e in entries] if self.top > 0 else [],
        )

    def _input(self) -> sglang_scheduler_pb2.InputLogProbs | None:
        if self.start is None:
            return None
        if self._prompt_message is None:
            ranking, ids = Ranking(self.vocab), self.prompt_ids
            # The first position has no value: its logprob needs the state before it, not computed.
            message = sglang_scheduler_pb2.InputLogProbs(token_ids=ids[self.start :])
            message.token_logprobs.add()
            if self.top > 0:
                message.top_logprobs.add()
            for position in range(self.start + 1, len(ids)):
                entry = ranking.prompt(ids, position, self.top)
                message.token_logprobs.add(value=entry.logprob)
                if self.top > 0:
                    message.top_logprobs.append(_top(entry))
            self._prompt_message = message
        return self._prompt_message

    def chunk(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], total: int, cached: int
    ) -> sglang_scheduler_pb2.GenerateResponse:
        prompt = None
        if index not in self._input_sent:
            self._input_sent.add(index)
            prompt = self._input()
        self._last_input.pop(index, None)
        if prompt is not None:
            self._last_input[index] = prompt
        return sglang_scheduler_pb2.GenerateResponse(
            request_id=self.request_id,
            chunk=sglang_scheduler_pb2.GenerateStreamChunk(
                token_ids=tokens,
                prompt_tokens=len(self.prompt_ids),
                completion_tokens=total,
                cached_tokens=cached,
                index=index,
                output_logprobs=self._output(tokens, logprobs),
                input_logprobs=prompt,
            ),
        )

    def stream_complete(
        self,
        index: int,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        total: int,
        cached: int,
        finish: Finish,
    ) -> sglang_scheduler_pb2.GenerateResponse:
        return self._complete(index, tokens, logprobs, total, cached, finish, self._last_input.get(index))

    def final(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], cached: int, finish: Finish
    ) -> sglang_scheduler_pb2.GenerateResponse:
        return self._complete(index, tokens, logprobs, len(tokens), cached, finish, self._input())

    def _complete(
        self,
        index: int,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        total: int,
        cached: int,
        finish: Finish,
        prompt: sglang_scheduler_pb2.InputLogProbs | None,
    ) -> sglang_scheduler_pb2.GenerateResponse:
        message = sglang_scheduler_pb2.GenerateComplete(
            output_ids=tokens,
            finish_reason=finish.reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=total,
            cached_tokens=cached,
            index=index,
            output_logprobs=self._output(tokens, logprobs),
            input_logprobs=prompt,
        )
        if finish.matched_token_id is not None:
            message.matched_token_id = finish.matched_token_id
        elif finish.matched_stop_str is not None:
            message.matched_stop_str = finish.matched_stop_str
        return sglang_scheduler_pb2.GenerateResponse(request_id=self.request_id, complete=message)


def aggregate(loads: list[sglang_scheduler_pb2.SchedulerLoad]) -> sglang_scheduler_pb2.AggregateMetrics:
    """SGLang's aggregate over the listed ranks: request counts summed, usage and rate averaged."""
    count = max(len(loads), 1)  # an empty list (a filter on a missing rank) aggregates to zeros
    return sglang_scheduler_pb2.AggregateMetrics(
        total_running_reqs=sum(load.num_running_reqs for load in loads),
        total_waiting_reqs=sum(load.num_waiting_reqs for load in loads),
        total_reqs=sum(load.num_total_reqs for load in loads),
        avg_token_usage=sum(load.token_usage for load in loads) / count,
        avg_throughput=sum(load.gen_throughput for load in loads) / count,
        avg_utilization=sum(load.utilization for load in loads) / count,
    )


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
        start = input_logprob_start(request)
        prompt_ids, params, n, rank = await admit(
            core, _as_vllm(request), context, check=lambda ids: check_logprob_start(start, len(ids))
        )
        admitted = core.submit(request.request_id, prompt_ids, params, n, cache_limit=start, rank=rank)
        messages = SglangMessages(request, prompt_ids, start, core.vocab)
        async for response in serve(core, admitted, request.stream, context, messages):
            yield response

    async def Abort(
        self, request: sglang_scheduler_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.AbortResponse:
        self.core.stats.abort_calls += 1
        self.core.abort([request.request_id])
        return sglang_scheduler_pb2.AbortResponse(success=True, message="")

    async def HealthCheck(
        self, request: sglang_scheduler_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> sglang_scheduler_pb2.HealthCheckResponse:
        await self.core.faults.delay_health_check()
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
                "dp_size": core.data_parallel_size,
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
        core = self.core
        ranks = core.ranks(request.dp_rank if request.HasField("dp_rank") else None)
        loads = [sglang_scheduler_pb2.SchedulerLoad(**core.load_fields(rank)) for rank in ranks]
        return sglang_scheduler_pb2.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=SGLANG_VERSION,
            dp_rank_count=core.data_parallel_size,
            loads=loads,
            aggregate=aggregate(loads),
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
