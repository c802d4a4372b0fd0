"""Generate's messages, in the shapes the real vLLM servicer sends them.

Streaming (vLLM's DELTA output): one chunk per engine step holding that step's new tokens, and after the
chunk that finishes the request a `complete` carrying that same last delta (not the whole output): the
gateway accumulates. Non-streaming (FINAL_ONLY): a single `complete` with every output token.

An aborted request is finished by vLLM with an empty delta and finish_reason "abort", so a stream ends
with an empty chunk and an empty `complete`, and a non-streamed request with what it had so far.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg_grpc_proto.generated import vllm_engine_pb2


def chunk(token_ids: Sequence[int], prompt_tokens: int) -> vllm_engine_pb2.GenerateResponse:
    return vllm_engine_pb2.GenerateResponse(
        chunk=vllm_engine_pb2.GenerateStreamChunk(
            token_ids=token_ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(token_ids),  # the delta's count: the gateway sums them
            cached_tokens=0,
            index=0,
        )
    )


def complete(
    output_ids: Sequence[int],
    prompt_tokens: int,
    finish_reason: str,
    *,
    matched_token_id: int | None = None,
    matched_stop_str: str | None = None,
) -> vllm_engine_pb2.GenerateResponse:
    message = vllm_engine_pb2.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=0,
        index=0,
    )
    # `matched_stop` is a oneof: vLLM sets it only for a stop token id or a stop string.
    if matched_token_id is not None:
        message.matched_token_id = matched_token_id
    elif matched_stop_str is not None:
        message.matched_stop_str = matched_stop_str
    return vllm_engine_pb2.GenerateResponse(complete=message)
