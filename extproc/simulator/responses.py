"""Generate's messages, in the shapes the real vLLM servicer sends them.

Streaming (vLLM's DELTA output): one chunk per engine step holding that step's new tokens, and after the
chunk that finishes the request a `complete` carrying that same last delta (not the whole output): the
gateway accumulates. Non-streaming (FINAL_ONLY): a single `complete` with every output token.

An aborted request is finished by vLLM with an empty delta and finish_reason "abort", so a stream ends
with an empty chunk and an empty `complete`, and a non-streamed request with what it had so far.
With n > 1, each choice streams under its own `index` and gets its own `complete` when it finishes.

Logprobs, as the servicer converts vLLM's: `output_logprobs` carries the delta's tokens (the whole output
in a non-streamed `complete`), each token's logprob and, when `logprobs` > 0, its top list: the token
itself first, then the step's likeliest other tokens, `logprobs` entries in all (so the list is sorted
only when the token was the likeliest). A delta without tokens carries none. `input_logprobs` (asked by
`prompt_logprobs`) covers every prompt token, the first without a value (and with an empty top list);
a stream carries it once, on the request's first chunk (and on a `complete` that repeats that chunk),
a non-streamed request on every choice's `complete`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from smg_grpc_proto.generated import vllm_engine_pb2

from extproc.simulator.logprobs import Ranking, TokenLogprob
from extproc.simulator.sampler import Step, requested_prompt_logprobs
from extproc.simulator.vocab import PlausibleVocab


def chunk(
    token_ids: Sequence[int],
    prompt_tokens: int,
    cached_tokens: int = 0,
    index: int = 0,
    output_logprobs: vllm_engine_pb2.OutputLogProbs | None = None,
    input_logprobs: vllm_engine_pb2.InputLogProbs | None = None,
) -> vllm_engine_pb2.GenerateResponse:
    return vllm_engine_pb2.GenerateResponse(
        chunk=vllm_engine_pb2.GenerateStreamChunk(
            token_ids=token_ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(token_ids),  # the delta's count: the gateway sums them
            cached_tokens=cached_tokens,  # the request's prefix-cache hit, on every chunk
            index=index,
            output_logprobs=output_logprobs,
            input_logprobs=input_logprobs,
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
    output_logprobs: vllm_engine_pb2.OutputLogProbs | None = None,
    input_logprobs: vllm_engine_pb2.InputLogProbs | None = None,
) -> vllm_engine_pb2.GenerateResponse:
    message = vllm_engine_pb2.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=cached_tokens,
        index=index,
        output_logprobs=output_logprobs,
        input_logprobs=input_logprobs,
    )
    # `matched_stop` is a oneof: vLLM sets it only for a stop token id or a stop string.
    if finish.matched_token_id is not None:
        message.matched_token_id = finish.matched_token_id
    elif finish.matched_stop_str is not None:
        message.matched_stop_str = finish.matched_stop_str
    return vllm_engine_pb2.GenerateResponse(complete=message)


def top_list(token: int, entry: TokenLogprob, k: int) -> vllm_engine_pb2.TopLogProbs:
    """vLLM's order: the token first, then the likeliest others, k in all."""
    top = vllm_engine_pb2.TopLogProbs(token_ids=[token], values=[entry.logprob])
    for other, value in entry.top:
        if len(top.token_ids) >= k:
            break
        if other != token:
            top.token_ids.append(other)
            top.values.append(value)
    return top


def output_logprobs(
    tokens: Sequence[int], entries: Sequence[TokenLogprob], k: int | None
) -> vllm_engine_pb2.OutputLogProbs | None:
    if k is None or not tokens:
        return None
    message = vllm_engine_pb2.OutputLogProbs(token_logprobs=[e.logprob for e in entries], token_ids=tokens)
    if k > 0:
        message.top_logprobs.extend(top_list(t, e, k) for t, e in zip(tokens, entries, strict=True))
    return message


def input_logprobs(prompt_ids: Sequence[int], ranking: Ranking, k: int) -> vllm_engine_pb2.InputLogProbs:
    """Every prompt token; the first has no value (nothing precedes it) and an empty top list."""
    message = vllm_engine_pb2.InputLogProbs(token_ids=prompt_ids)
    message.token_logprobs.add()
    if k > 0:
        message.top_logprobs.add()
    for position in range(1, len(prompt_ids)):
        entry = ranking.prompt(prompt_ids, position, k)
        message.token_logprobs.add(value=entry.logprob)
        if k > 0:
            message.top_logprobs.append(top_list(prompt_ids[position], entry, k))
    return message


class VllmMessages:
    """Generate's messages for one vLLM request (`generate.Messages`)."""

    def __init__(
        self, prompt_ids: list[int], sampling: vllm_engine_pb2.SamplingParams, vocab: PlausibleVocab
    ) -> None:
        self.prompt_ids = prompt_ids
        self.top = sampling.logprobs if sampling.HasField("logprobs") else None
        self.prompt_top = requested_prompt_logprobs(sampling)
        self.vocab = vocab
        self._input_sent = False  # a stream carries the prompt's logprobs once
        self._last_input: dict[int, vllm_engine_pb2.InputLogProbs] = {}
        self._prompt_message: vllm_engine_pb2.InputLogProbs | None = None

    def _input(self) -> vllm_engine_pb2.InputLogProbs | None:
        if self.prompt_top is None:
            return None
        if self._prompt_message is None:
            # -1 (the whole vocabulary) never gets here: it exceeds max_logprobs, refused at admission.
            self._prompt_message = input_logprobs(self.prompt_ids, Ranking(self.vocab), self.prompt_top)
        return self._prompt_message

    def chunk(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], total: int, cached: int
    ) -> vllm_engine_pb2.GenerateResponse:
        prompt = None
        if not self._input_sent:
            self._input_sent = True
            prompt = self._input()
        self._last_input.pop(index, None)
        if prompt is not None:
            self._last_input[index] = prompt
        return chunk(
            tokens,
            len(self.prompt_ids),
            cached,
            index,
            output_logprobs(tokens, logprobs, self.top),
            prompt,
        )

    def stream_complete(
        self,
        index: int,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        total: int,
        cached: int,
        finish: Finish,
    ) -> vllm_engine_pb2.GenerateResponse:
        return complete(
            tokens,
            len(self.prompt_ids),
            finish,
            cached_tokens=cached,
            index=index,
            output_logprobs=output_logprobs(tokens, logprobs, self.top),
            input_logprobs=self._last_input.get(index),
        )

    def final(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], cached: int, finish: Finish
    ) -> vllm_engine_pb2.GenerateResponse:
        return complete(
            tokens,
            len(self.prompt_ids),
            finish,
            cached_tokens=cached,
            index=index,
            output_logprobs=output_logprobs(tokens, logprobs, self.top),
            input_logprobs=self._input(),
        )
