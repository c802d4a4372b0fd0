"""One way to ask either API, streamed or not, through the official client, and read the answer back in
one shape: every test gets the stream's and the JSON's OpenAI invariants checked on the way.

`ask(gw, "chat" | "completions", stream, prompt, **params)`: `prompt` is the user message (chat) or the
prompt (completions); `logprobs=k` means chat's `logprobs=True, top_logprobs=k` and completions'
`logprobs=k`; vLLM's extra parameters go in `extra_body` as a client must send them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openai.types import Completion, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.conformance.stacks import Gateway

# Parameters the openai client has no argument for: they travel in `extra_body`.
EXTRA_BODY = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "continue_final_message",
        "add_generation_prompt",
        "chat_template_kwargs",
    }
)


@dataclass
class TokenLogprob:
    """One output token's logprob and its alternatives, whichever API reported it."""

    token: str
    logprob: float
    top: dict[str, float]  # alternative token text -> logprob
    top_order: list[float] = field(default_factory=list)  # alternatives' logprobs as listed (chat)


@dataclass
class Answer:
    id: str
    texts: list[str]  # by choice index
    finish_reasons: list[str | None]
    usage: CompletionUsage | None
    logprobs: list[list[TokenLogprob] | None]
    # Completions only: each choice's text_offset list (None without logprobs).
    text_offsets: list[list[int] | None]
    chunks: int = 0  # streamed chunks received (0 for a JSON answer)

    @property
    def text(self) -> str:
        assert len(self.texts) == 1
        return self.texts[0]

    @property
    def finish_reason(self) -> str | None:
        assert len(self.finish_reasons) == 1
        return self.finish_reasons[0]


def request_kwargs(gw: Gateway, api: str, prompt: Any, params: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model": gw.model}
    if api == "chat":
        kwargs["messages"] = params.pop("messages", [{"role": "user", "content": prompt}])
    else:
        kwargs["prompt"] = prompt
    logprobs = params.pop("logprobs", None)
    if logprobs is not None:
        if api == "chat":
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = logprobs
        else:
            kwargs["logprobs"] = logprobs
    extra = {k: params.pop(k) for k in list(params) if k in EXTRA_BODY}
    if extra:
        kwargs["extra_body"] = extra
    kwargs.update(params)
    return kwargs


def ask(gw: Gateway, api: str, stream: bool, prompt: Any = "Tell me a story.", **params: Any) -> Answer:
    """`stream_options.include_usage` is on for streams unless `stream_options` is given."""
    kwargs = request_kwargs(gw, api, prompt, dict(params))
    n = kwargs.get("n", 1)
    create = gw.client.chat.completions.create if api == "chat" else gw.client.completions.create
    if not stream:
        answer = create(**kwargs)
        return read_chat(gw, answer, n) if api == "chat" else read_completion(gw, answer, n)
    kwargs.setdefault("stream_options", {"include_usage": True})
    chunks = list(create(stream=True, **kwargs))
    include_usage = bool(kwargs["stream_options"].get("include_usage"))
    return read_stream(gw, api, chunks, n, include_usage)


def check_usage(usage: CompletionUsage | None) -> None:
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > 0
    assert usage.prompt_tokens_details is not None
    assert 0 <= (usage.prompt_tokens_details.cached_tokens or 0) < usage.prompt_tokens


def read_chat(gw: Gateway, r: ChatCompletion, n: int) -> Answer:
    assert isinstance(r, ChatCompletion)
    assert r.object == "chat.completion" and r.model == gw.model and r.id.startswith("chatcmpl-")
    assert [c.index for c in r.choices] == list(range(n))
    check_usage(r.usage)
    logprobs: list[list[TokenLogprob] | None] = []
    for c in r.choices:
        assert c.message.role == "assistant"
        assert c.finish_reason in ("stop", "length")
        if c.logprobs is None:
            logprobs.append(None)
        else:
            assert c.logprobs.content is not None
            logprobs.append(
                [
                    TokenLogprob(
                        e.token,
                        e.logprob,
                        {t.token: t.logprob for t in e.top_logprobs},
                        [t.logprob for t in e.top_logprobs],
                    )
                    for e in c.logprobs.content
                ]
            )
    return Answer(
        r.id,
        [c.message.content or "" for c in r.choices],
        [c.finish_reason for c in r.choices],
        r.usage,
        logprobs,
        [None] * n,
    )


def completion_logprobs(lp: Any) -> tuple[list[TokenLogprob], list[int]]:
    tokens, values, tops, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    assert len(tokens) == len(values) == len(tops) == len(offsets), "parallel lists"
    entries = [
        TokenLogprob(t, v, dict(top), list(top.values()))
        for t, v, top in zip(tokens, values, tops, strict=True)
    ]
    return entries, list(offsets)


def read_completion(gw: Gateway, r: Completion, n: int) -> Answer:
    assert isinstance(r, Completion)
    assert r.object == "text_completion" and r.model == gw.model and r.id.startswith("cmpl-")
    assert [c.index for c in r.choices] == list(range(n))
    check_usage(r.usage)
    logprobs: list[list[TokenLogprob] | None] = []
    offsets: list[list[int] | None] = []
    for c in r.choices:
        assert c.finish_reason in ("stop", "length")
        if c.logprobs is None:
            logprobs.append(None)
            offsets.append(None)
        else:
            entries, offset = completion_logprobs(c.logprobs)
            logprobs.append(entries)
            offsets.append(offset)
    return Answer(
        r.id, [c.text for c in r.choices], [c.finish_reason for c in r.choices], r.usage, logprobs, offsets
    )


def read_stream(gw: Gateway, api: str, chunks: list[Any], n: int, include_usage: bool) -> Answer:
    """Stream invariants: one id, one choice per chunk, a chat choice opens with the assistant role, each
    choice finishes once and says nothing after, usage only on a last chunk without choices."""
    assert chunks
    ids = {c.id for c in chunks}
    assert len(ids) == 1, ids
    response_id = chunks[0].id
    usage = None
    if include_usage:
        last = chunks[-1]
        assert last.choices == [] and last.usage is not None, last
        usage = last.usage
        check_usage(usage)
        chunks = chunks[:-1]
    texts = [""] * n
    finishes: list[str | None] = [None] * n
    logprobs: list[list[TokenLogprob] | None] = [None] * n
    offsets: list[list[int] | None] = [None] * n
    opened: set[int] = set()
    for chunk in chunks:
        assert chunk.model == gw.model
        assert chunk.usage is None, "usage only on the last chunk, and only when asked for"
        assert len(chunk.choices) == 1, "each chunk carries one choice"
        choice = chunk.choices[0]
        i = choice.index
        assert 0 <= i < n
        assert finishes[i] is None, f"choice {i} went on after finishing"
        if api == "chat":
            assert isinstance(chunk, ChatCompletionChunk) and chunk.object == "chat.completion.chunk"
            if i not in opened:
                assert choice.delta.role == "assistant", "a chat choice opens with the assistant role"
                opened.add(i)
            texts[i] += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                logprobs[i] = (logprobs[i] or []) + [
                    TokenLogprob(
                        e.token,
                        e.logprob,
                        {t.token: t.logprob for t in e.top_logprobs},
                        [t.logprob for t in e.top_logprobs],
                    )
                    for e in choice.logprobs.content
                ]
        else:
            assert isinstance(chunk, Completion) and chunk.object == "text_completion"
            texts[i] += choice.text
            if choice.logprobs is not None and choice.logprobs.tokens:
                entries, offset = completion_logprobs(choice.logprobs)
                logprobs[i] = (logprobs[i] or []) + entries
                offsets[i] = (offsets[i] or []) + offset
        if choice.finish_reason is not None:
            assert choice.finish_reason in ("stop", "length")
            finishes[i] = choice.finish_reason
    assert all(f is not None for f in finishes), f"every choice finishes: {finishes}"
    return Answer(response_id, texts, finishes, usage, logprobs, offsets, chunks=len(chunks))
