"""Workloads: deterministic streams of chat requests, the same for every target.

Request `i` of a workload depends only on (workload, seed, i), so two runs, or two gateways in one run,
send identical prompts, and every prompt is unique (no tokenizer or prefix cache can answer it for free)
except where sharing is the point (multi-turn). Each request knows its prompt's token ids, so the
bare-engine floor can send them without tokenizing.

Prompt sizes count the Llama 3 template's markup: BOS, 4 header tokens and an end-of-turn per message,
and 4 for the assistant's generation prompt.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from load.loadgen.text import Text, Vocab

MARKUP_PER_MESSAGE = 5  # <|start_header_id|> role <|end_header_id|> "\n\n" ... <|eot_id|>
MARKUP_FIXED = 1 + 4  # BOS, and the generation prompt's header


@dataclass(frozen=True)
class Message:
    role: str
    text: Text


@dataclass(frozen=True)
class ChatSpec:
    """One request: what to send and what shape of answer to ask for."""

    kind: str
    messages: tuple[Message, ...]
    max_tokens: int
    stream: bool
    # The request's `tools` (OpenAI function tools), when the workload declares some.
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def prompt_tokens(self) -> int:
        """Tokens after templating, as the engine sees them."""
        return MARKUP_FIXED + sum(MARKUP_PER_MESSAGE + len(m.text.ids) for m in self.messages)

    def openai_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text.content} for m in self.messages]


def _rng(seed: int, *key: object) -> random.Random:
    # str seeds hash deterministically (sha512), unlike hash() of a tuple across processes.
    return random.Random(f"{seed}:" + ":".join(map(str, key)))


def _short_chat(vocab: Vocab, seed: int, i: int, kind: str) -> tuple[Message, ...]:
    # 15 + 40 words of content + 15 of markup: ~70 prompt tokens.
    rng = _rng(seed, kind, i)
    return (Message("system", vocab.text(rng, 15)), Message("user", vocab.text(rng, 40)))


def _rag(prompt_tokens: int) -> Callable[[Vocab, int, int, str], tuple[Message, ...]]:
    def build(vocab: Vocab, seed: int, i: int, kind: str) -> tuple[Message, ...]:
        rng = _rng(seed, kind, i)
        system = vocab.text(rng, 15)
        context = prompt_tokens - MARKUP_FIXED - 2 * MARKUP_PER_MESSAGE - len(system.ids)
        return (Message("system", system), Message("user", vocab.text(rng, context)))

    return build


# Multi-turn chat: every conversation starts with the same long system prompt (the shared prefix), and
# turn t repeats the conversation's t earlier exchanges. CONVERSATIONS_IN_FLIGHT conversations advance
# together, as many users would: request i is turn (i // K) % T of conversation K * (i // (K*T)) + i % K.
SYSTEM_PROMPT_WORDS = 1000
TURNS = 8
CONVERSATIONS_IN_FLIGHT = 16
USER_WORDS, ASSISTANT_WORDS = 40, 60


def _multi_turn(vocab: Vocab, seed: int, i: int, kind: str) -> tuple[Message, ...]:
    k, turns = CONVERSATIONS_IN_FLIGHT, TURNS
    conversation = k * (i // (k * turns)) + i % k
    turn = (i // k) % turns
    messages = [Message("system", _shared_system_prompt(vocab, seed))]
    for t in range(turn + 1):
        messages.append(Message("user", vocab.text(_rng(seed, kind, conversation, t, "user"), USER_WORDS)))
        if t < turn:
            reply = vocab.text(_rng(seed, kind, conversation, t, "assistant"), ASSISTANT_WORDS)
            messages.append(Message("assistant", reply))
    return tuple(messages)


_SYSTEM_PROMPTS: dict[tuple[int, int], Text] = {}


def _shared_system_prompt(vocab: Vocab, seed: int) -> Text:
    key = (id(vocab), seed)
    if key not in _SYSTEM_PROMPTS:
        _SYSTEM_PROMPTS[key] = vocab.text(_rng(seed, "shared-system"), SYSTEM_PROMPT_WORDS)
    return _SYSTEM_PROMPTS[key]


# Agent traffic: a request that declares a tool, whose (scripted) answer is a Hermes tool call with ~150
# tokens of arguments, then plausible words up to max_tokens; and the same-length plain answer. The engines
# are scripted (TOOL_SCRIPT) to say the call to any prompt that shows the tool's name, which the chat
# template renders from `tools`; both gateways parse Hermes calls (`--tool-parser hermes`, SMG's
# `--tool-call-parser qwen`).
BENCH_TOOL_NAME = "bench_lookup_order"
BENCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": BENCH_TOOL_NAME,
        "description": "Look up an order and its shipment.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object"}},
                "note": {"type": "string"},
            },
            "required": ["order_id"],
        },
    },
}
TOOL_ARGUMENTS: dict[str, Any] = {
    "order_id": "ORD-2024-118833",
    "items": [
        {"sku": f"SKU-{i:04d}", "quantity": i % 3 + 1, "gift": i % 2 == 0, "warehouse": "eu-west"}
        for i in range(6)
    ],
    "note": "Customer asked for delivery after six in the evening, leave at the reception desk if absent.",
}
TOOL_CALL_TEXT = (
    "<tool_call>\n" + json.dumps({"name": BENCH_TOOL_NAME, "arguments": TOOL_ARGUMENTS}) + "\n</tool_call>"
)
# The call is 221 tokens with the Llama 3 tokenizer (202 of arguments); both agent workloads answer this
# many tokens (the call, then words).
AGENT_ANSWER_TOKENS = 240
TOOL_SCRIPT: list[dict[str, Any]] = [{"match": BENCH_TOOL_NAME, "text": TOOL_CALL_TEXT}]
LONG_STREAM_TOKENS = 256


@dataclass(frozen=True)
class Shape:
    """A named kind of request: how its messages are built and what it asks for by default."""

    build: Callable[[Vocab, int, int, str], tuple[Message, ...]]
    stream: bool
    max_tokens: int = 16
    description: str = ""
    tools: tuple[dict[str, Any], ...] = ()


SHAPES: dict[str, Shape] = {
    "chat": Shape(_short_chat, False, description="short chat, ~70 prompt tokens, not streamed"),
    "chat-stream": Shape(_short_chat, True, description="short chat, ~70 prompt tokens, streamed"),
    "rag-6k": Shape(_rag(6600), False, description="long-context RAG, 6,600 prompt tokens, not streamed"),
    "rag-30k": Shape(_rag(30000), True, description="long-context RAG, 30,000 prompt tokens, streamed"),
    "multi-turn": Shape(
        _multi_turn,
        True,
        description=f"multi-turn chat, {SYSTEM_PROMPT_WORDS}-token shared system prompt, up to {TURNS} "
        "turns (~1,100-1,900 prompt tokens), streamed",
    ),
    "tool-stream": Shape(
        _short_chat,
        True,
        max_tokens=AGENT_ANSWER_TOKENS,
        tools=(BENCH_TOOL,),
        description=f"short chat with one tool, streamed; the answer is a Hermes tool call (221 tokens) then "
        f"words, {AGENT_ANSWER_TOKENS} tokens in all",
    ),
    # Long streams (issue 17): the gateway's per-token cost dominates; the benchmark runs them on engines
    # that take a 2 ms step between messages.
    "stream-256": Shape(
        _short_chat,
        True,
        max_tokens=LONG_STREAM_TOKENS,
        description=f"short chat, streamed, a {LONG_STREAM_TOKENS}-token answer",
    ),
    "plain-stream": Shape(
        _short_chat,
        True,
        max_tokens=AGENT_ANSWER_TOKENS,
        description=f"short chat, streamed, a plain {AGENT_ANSWER_TOKENS}-token answer (as tool-stream's)",
    ),
}

# The mix: each request's kind drawn (deterministically) with these weights.
MIX: tuple[tuple[str, float], ...] = (
    ("chat", 0.4),
    ("chat-stream", 0.2),
    ("multi-turn", 0.3),
    ("rag-6k", 0.1),
)
WORKLOADS: tuple[str, ...] = (*SHAPES, "mix")


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int = 0
    # None: the shape's default.
    stream: bool | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(WORKLOADS)}")

    def spec(self, vocab: Vocab, i: int) -> ChatSpec:
        kind = self.name
        if kind == "mix":
            names, weights = zip(*MIX, strict=True)
            kind = _rng(self.seed, "mix", i).choices(names, weights)[0]
        shape = SHAPES[kind]
        return ChatSpec(
            kind=kind,
            messages=shape.build(vocab, self.seed, i, kind),
            max_tokens=self.max_tokens if self.max_tokens is not None else shape.max_tokens,
            stream=self.stream if self.stream is not None else shape.stream,
            tools=shape.tools,
        )

    def specs(self, vocab: Vocab, count: int, start: int = 0) -> list[ChatSpec]:
        return [self.spec(vocab, i) for i in range(start, start + count)]

    def with_seed(self, seed: int) -> Workload:
        return replace(self, seed=seed)
