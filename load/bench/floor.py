"""The floor: the engines called directly over gRPC with pre-tokenized prompts, no gateway in between.

What a gateway adds is measured against this: its latency minus the floor's is the gateway's added
latency, and the floor's throughput is what the engines and the client manage alone on this machine.
Prompts are the workload's own token ids in the Llama 3 chat layout, identical to what a gateway's
templating and tokenizing produce, so the engine does the same work. Requests go round-robin over the
engines, as the gateways are configured to.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from load.loadgen.records import Record
from load.loadgen.text import Vocab
from load.loadgen.workloads import ChatSpec

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
BOS = "<|begin_of_text|>"
EOT = "<|eot_id|>"


def header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


def prompt_ids(spec: ChatSpec, vocab: Vocab) -> list[int]:
    """The token ids the project's default chat template and the Llama 3 tokenizer give this request."""
    ids = list(vocab.encode(BOS))
    eot = vocab.encode(EOT)
    for message in spec.messages:
        ids += vocab.encode(header(message.role))
        ids += message.text.ids
        ids += eot
    ids += vocab.encode(header("assistant"))
    return ids


@dataclass(frozen=True)
class Prepared:
    kind: str
    stream: bool
    request: bytes  # a serialized GenerateRequest


class FloorTarget:
    def __init__(self, addresses: list[str], vocab: Vocab) -> None:
        self.vocab = vocab
        # A connection per channel, even to one address (gRPC shares them across channels by default).
        options = [("grpc.use_local_subchannel_pool", 1)]
        self._channels = [grpc.aio.insecure_channel(a, options=options) for a in addresses]
        # Requests are prebuilt bytes: no serializer on the way out.
        decode = pb.GenerateResponse.FromString
        self._calls = [
            ch.unary_stream(GENERATE, request_serializer=None, response_deserializer=decode)
            for ch in self._channels
        ]
        self._next = itertools.cycle(self._calls)
        self._ids = itertools.count()

    def prepare(self, spec: ChatSpec) -> Prepared:
        request = pb.GenerateRequest(
            request_id=f"floor-{next(self._ids)}",
            tokenized=pb.TokenizedInput(input_ids=prompt_ids(spec, self.vocab)),
            sampling_params=pb.SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
            stream=spec.stream,
        )
        return Prepared(spec.kind, spec.stream, request.SerializeToString())

    async def send(self, prepared: Prepared, run_start: float) -> Record:
        call = next(self._next)
        start = time.perf_counter()
        record = Record(prepared.kind, prepared.stream, start - run_start)
        times: list[float] = []
        streamed = 0
        complete = None
        try:
            async for response in call(prepared.request):
                kind = response.WhichOneof("response")
                if kind == "chunk":
                    if response.chunk.token_ids:
                        times.append(time.perf_counter())
                        streamed += len(response.chunk.token_ids)
                elif kind == "complete":
                    complete = response.complete
        except grpc.aio.AioRpcError as exc:
            record.error = f"gRPC {exc.code().name}: {exc.details()}"
            return record
        end = time.perf_counter()
        record.latency = end - start
        if complete is None:
            record.error = "stream ended without a complete message"
            return record
        record.status = 200
        record.prompt_tokens = complete.prompt_tokens
        # A stream's `complete` repeats its last delta; a plain answer's holds every token.
        record.output_tokens = streamed if prepared.stream else len(complete.output_ids)
        if prepared.stream and times:
            record.ttft = times[0] - start
            record.itl = [b - a for a, b in itertools.pairwise(times)]
        return record

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
