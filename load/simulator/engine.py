"""One simulated vLLM engine: the `vllm.grpc.engine.VllmEngine` service, without a model.

Generation is paced by the configured time-to-first-token and inter-token latency and its tokens come
from `TokenSampler`; message shapes follow the real servicer (`responses`). RPCs this class does not
override answer UNIMPLEMENTED (the generated base class does that).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from load.simulator import responses
from load.simulator.model import ModelSpec
from load.simulator.options import DEFAULT_OPTIONS, SimOptions
from load.simulator.pacing import Pacer
from load.simulator.sampler import GenerationParams, TokenSampler, resolve_params
from load.simulator.vocab import PlausibleVocab

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """Counters a test (or a load report) reads in-process."""

    # Every Generate call that reached the engine, rejected ones included: the gateway's tests
    # assert this stays 0 to prove a bad request never got this far.
    generate_requests: int = 0
    rejected: int = 0  # refused with INVALID_ARGUMENT
    active: int = 0  # admitted and not finished yet
    completed: int = 0  # finished with "stop" or "length"
    aborts: int = 0  # ended by an Abort RPC
    cancelled: int = 0  # the caller went away (or the server stopped) first
    abort_calls: int = 0  # Abort RPCs received
    output_tokens: int = 0


class _Flight:
    """An admitted request, findable by its id so Abort can reach it."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.pacer = Pacer()

    @property
    def aborted(self) -> bool:
        return self.pacer.woken

    def abort(self) -> None:
        self.pacer.wake()


class VllmEngine(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(self, spec: ModelSpec, vocab: PlausibleVocab, options: SimOptions = DEFAULT_OPTIONS) -> None:
        self.spec = spec
        self.vocab = vocab
        self.options = options
        self.stats = EngineStats()
        self.port = 0  # set once the server hosting this engine has bound
        self._started = time.time()
        self._last_receive = 0.0
        # vLLM lets several requests share an external id; Abort ends them all.
        self._in_flight: dict[str, list[_Flight]] = {}

    # --- Generate -------------------------------------------------------------------------------

    async def Generate(
        self, request: vllm_engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        self.stats.generate_requests += 1
        self._last_receive = time.time()
        try:
            prompt_ids = self._prompt_ids(request)
            params = resolve_params(request.sampling_params, self.spec, prompt_ids)
        except ValueError as e:
            self.stats.rejected += 1
            logger.info("Generate %s rejected: %s", request.request_id, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return

        flight = _Flight(request.request_id)
        self._in_flight.setdefault(flight.request_id, []).append(flight)
        self.stats.active += 1
        try:
            async with aclosing(self._generate(flight, params, stream=request.stream)) as stream:
                async for response in stream:
                    yield response
        except (asyncio.CancelledError, GeneratorExit):
            # The caller went away: gRPC cancels the handler at a sleep (CancelledError), or closes
            # this generator where it waits at a yield (GeneratorExit). Stop generating either way.
            self.stats.cancelled += 1
            raise
        finally:
            self.stats.active -= 1
            flights = self._in_flight[flight.request_id]
            flights.remove(flight)
            if not flights:
                del self._in_flight[flight.request_id]

    @staticmethod
    def _prompt_ids(request: vllm_engine_pb2.GenerateRequest) -> list[int]:
        # The simulator has no tokenizer path: the gateway sends token ids, text is a caller bug.
        if request.WhichOneof("input") != "tokenized":
            raise ValueError("the simulator accepts tokenized input only (tokenized.input_ids)")
        return list(request.tokenized.input_ids)

    async def _generate(
        self, flight: _Flight, params: GenerationParams, *, stream: bool
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        sampler = TokenSampler(params, self.spec, self.vocab)
        pacer = flight.pacer
        first_due = pacer.now() + self.options.ttft_ms / 1000
        interval = self.options.itl_ms / 1000
        output: list[int] = []
        while True:
            await pacer.until(first_due + len(output) * interval)
            if flight.aborted:
                self.stats.aborts += 1
                if stream:
                    yield responses.chunk([], params.prompt_len)
                    yield responses.complete([], params.prompt_len, "abort")
                else:
                    yield responses.complete(output, params.prompt_len, "abort")
                return
            step = sampler.next_step()
            output.append(step.token_id)
            self.stats.output_tokens += 1
            if stream:
                yield responses.chunk([step.token_id], params.prompt_len)
            if step.finish_reason is not None:
                self.stats.completed += 1
                # The stream's `complete` repeats the last delta; non-streamed, it holds everything.
                # vLLM's token_ids include the EOS or stop token that ended the request (its
                # detokenizer drops it from the text only), so the simulator's do too.
                yield responses.complete(
                    [step.token_id] if stream else output,
                    params.prompt_len,
                    step.finish_reason,
                    matched_token_id=step.matched_token_id,
                    matched_stop_str=step.matched_stop_str,
                )
                return

    # --- Abort ----------------------------------------------------------------------------------

    async def Abort(
        self, request: vllm_engine_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.AbortResponse:
        self.stats.abort_calls += 1
        for request_id in request.request_ids:
            # An unknown or finished id is not an error (vLLM ignores it too).
            for flight in self._in_flight.get(request_id, ()):
                flight.abort()
        return vllm_engine_pb2.AbortResponse()

    # --- Management -----------------------------------------------------------------------------

    async def HealthCheck(
        self, request: vllm_engine_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.HealthCheckResponse:
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
        return vllm_engine_pb2.GetServerInfoResponse(
            active_requests=self.stats.active,
            is_paused=False,
            last_receive_timestamp=self._last_receive,
            uptime_seconds=time.time() - self._started,
            server_type="vllm-grpc",
            kv_cache_dtype="auto",
            block_size=self.options.block_size,
            model_dtype="torch.bfloat16",
            data_parallel_size=1,
            max_num_seqs=self.options.max_num_seqs,
        )
