"""Generate's messages, in the shapes the real vLLM servicer sends them.

Streaming (vLLM's DELTA output): one chunk per engine step holding that step's new tokens, and after the
chunk that finishes the request a `complete` carrying that same last delta (not the whole output): the
gateway accumulates. Non-streaming (FINAL_ONLY): a single `complete` with every output token.

An aborted request is finished by vLLM with an empty delta and finish_reason "abort", so a stream ends
with an empty chunk and an empty `complete`, and a non-streamed request with what it had so far.
With n > 1, each choice streams under its own `index` and gets its own `complete` when it finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from smg_grpc_proto.generated import vllm_engine_pb2

from load.simulator.sampler import Step


def chunk(
    token_ids: Sequence[int], prompt_tokens: int, cached_tokens: int = 0, index: int = 0
) -> vllm_engine_pb2.GenerateResponse:
    return vllm_engine_pb2.GenerateResponse(
        chunk=vllm_engine_pb2.GenerateStreamChunk(
            token_ids=token_ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(token_ids),  # the delta's count: the gateway sums them
            cached_tokens=cached_tokens,  # the request's prefix-cache hit, on every chunk
            index=index,
        )
    )


@dataclass(frozen=True)
class Finish:
    """Why a choice ended, as GenerateComplete reports it."""

    reason: str  # "stop", "length" or "abort"
    matched_token_id: int | None = None
    matched_stop_str: str | None = None

    @classmethod
    def of(cls, step: Step) -> Finish:
        assert step.finish_reason is not None
        return cls(step.finish_reason, step.matched_token_id, step.matched_stop_str)


def complete(
    output_ids: Sequence[int],
    prompt_tokens: int,
    finish: Finish,
    *,
    cached_tokens: int = 0,
    index: int = 0,
) -> vllm_engine_pb2.GenerateResponse:
    message = vllm_engine_pb2.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=cached_tokens,
        index=index,
    )
    # `matched_stop` is a oneof: vLLM sets it only for a stop token id or a stop string.
    if finish.matched_token_id is not None:
        message.matched_token_id = finish.matched_token_id
    elif finish.matched_stop_str is not None:
        message.matched_stop_str = finish.matched_stop_str
    return vllm_engine_pb2.GenerateResponse(complete=message)
