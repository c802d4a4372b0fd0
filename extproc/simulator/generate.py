"""Generate's walk, whatever the protocol: read a request's mailbox, cut injected faults, send a chunk per
step and a `complete` per finished choice (streamed), or one `complete` per choice at the end (not
streamed), and count how the request ended. The messages themselves come from the protocol's builder
(`responses.VllmMessages`, `sglang.SglangMessages`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, TypeVar

import grpc

from extproc.simulator.core import EngineCore, Request
from extproc.simulator.logprobs import TokenLogprob
from extproc.simulator.responses import Finish
from extproc.simulator.sampler import Step

Message = TypeVar("Message", covariant=True)


class Messages(Protocol[Message]):
    """A protocol's Generate messages for one request. `total` is the choice's output length so far."""

    def chunk(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], total: int, cached: int
    ) -> Message: ...

    def stream_complete(
        self,
        index: int,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        total: int,
        cached: int,
        finish: Finish,
    ) -> Message:
        """A stream's `complete`: repeats the choice's last chunk (its delta), with why it ended."""
        ...

    def final(
        self, index: int, tokens: list[int], logprobs: list[TokenLogprob], cached: int, finish: Finish
    ) -> Message:
        """A non-streamed choice's only message: every token."""
        ...


def step_deltas(tokens: list[int], finish: Step | None = None, per_message: int = 1) -> list[list[int]]:
    """One delta per engine step (a token each, or `per_message` tokens each); an abort adds the empty
    delta vLLM ends it with.

    vLLM sends a chunk per step while its reader keeps up (it merges deltas only for a reader that
    lags); the simulator sends one per step unless told to merge (SimOptions.tokens_per_message), which
    keeps event counts predictable for tests.
    """
    deltas = [tokens[i : i + per_message] for i in range(0, len(tokens), per_message)]
    if not deltas or (finish is not None and finish.finish_reason == "abort"):
        deltas.append([])
    return deltas


async def walk(
    core: EngineCore,
    admitted: Request,
    stream: bool,
    context: grpc.aio.ServicerContext,
    messages: Messages[Message],
) -> AsyncIterator[Message]:
    mailbox = admitted.mailbox
    n = len(admitted.sequences)
    outputs: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
    finishes: list[Finish | None] = [None] * n
    die_after = core.faults.settings.die_after_tokens
    sent = 0
    # Tokens per streamed message (the timing when the request started); tokens short of a full message
    # wait here for the next news, or the finish.
    per_message = core.options.tokens_per_message if stream else 1
    held: list[list[int]] = [[] for _ in range(n)]
    held_logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
    while any(f is None for f in finishes):
        await mailbox.wait()
        for news in mailbox.take():
            index = news.index
            if die_after is not None and sent + len(news.tokens) > die_after:
                core.stats.faults += 1
                admitted.faulted = True
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine died mid-stream (injected)")
            sent += len(news.tokens)
            cached = mailbox.cached[index]
            tokens, news_logprobs = news.tokens, news.logprobs
            if per_message > 1:
                tokens, news_logprobs = held[index] + tokens, held_logprobs[index] + news_logprobs
                keep = 0 if news.finish is not None else len(tokens) % per_message
                held[index], held_logprobs[index] = (
                    tokens[len(tokens) - keep :],
                    news_logprobs[len(tokens) - keep :],
                )
                tokens, news_logprobs = tokens[: len(tokens) - keep], news_logprobs[: len(tokens) - keep]
                if not tokens and news.finish is None:
                    continue
            deltas = step_deltas(tokens, news.finish, per_message)
            delta_logprobs: list[TokenLogprob] = []
            for position, delta in enumerate(deltas):
                first = position * per_message
                delta_logprobs = news_logprobs[first : first + len(delta)] if delta else []
                outputs[index].extend(delta)
                logprobs[index].extend(delta_logprobs)
                if stream:
                    yield messages.chunk(index, delta, delta_logprobs, len(outputs[index]), cached)
            if news.finish is None:
                continue
            finish = finishes[index] = Finish.of(news.finish)
            if stream:
                yield messages.stream_complete(
                    index, deltas[-1], delta_logprobs, len(outputs[index]), cached, finish
                )
    if not stream:
        for index, finish in enumerate(finishes):
            assert finish is not None
            yield messages.final(index, outputs[index], logprobs[index], mailbox.cached[index], finish)
    reasons = [f.reason for f in finishes if f is not None]
    core.finished.update(reasons)
    if "abort" in reasons:
        core.stats.aborts += 1
    else:
        core.stats.completed += 1


async def serve(
    core: EngineCore,
    admitted: Request,
    stream: bool,
    context: grpc.aio.ServicerContext,
    messages: Messages[Message],
) -> AsyncIterator[Message]:
    """A Generate call's messages (`walk`), then the request released whatever ended it."""
    cancelled = True
    try:
        async for response in walk(core, admitted, stream, context, messages):
            yield response
        cancelled = False
    finally:
        # The caller went away (CancelledError at an await, GeneratorExit at a yield), an injected
        # fault ended the stream, or it finished: either way the engine stops working on it.
        core.release(admitted, cancelled=cancelled and not admitted.faulted)
