"""The workload suite's shapes (issue 13): six of prefix sharing and one decode-heavy, as session generators.

A shape is a stream of sessions; a session is one or more requests (turns) sent in order, each turn
re-sending the whole history. Every parameter that sets a shape's size (how many prompts or documents,
their lengths, turns, outputs, skew) is *drawn* from a wide range by the seed, never chosen to suit a
policy: running the suite over several seeds runs each shape at several sizes. The draws are in
`params` and go into the report.

| shape | what is shared |
|---|---|
| `system_prompts` | 2-5 system prompts (1.2-3k tokens), each user bound to one; multi-turn, short answers |
| `rag` | 4-10 documents (0.8-2.5k tokens); each question brings 1-3 of them, in any order |
| `sessions` | nothing across sessions: each long multi-turn chat has its own prefix |
| `agentic` | a shared tool preamble; each turn appends a tool call and a long tool result |
| `no_sharing` | nothing: unique single-turn prompts of 0.1-2.5k tokens |
| `zipf` | 30-120 prefixes (0.4-2k tokens), Zipf popularity (exponent 0.8-1.4), unique suffixes |
| `long_answers` | 1-4 system prompts (0.2-1.2k tokens); chats whose answers run 64-384 tokens: decode-heavy |

Prompts are random words of the real vocabulary, one token each (`load.loadgen.text`). Every request
carries its session key in `user` and `shares` names the shared part it starts with (`prompt-2`,
`doc-4`, `tools`, or `-` for none), for breakdowns and tests. Deterministic by (shape, seed, session).

Every shape but `long_answers` answers in 8-48 tokens, so prefill is what costs time; `long_answers` keeps
requests decoding for seconds (the bench's engines: ~25 ms a token), so an engine's running requests are
mostly decodes, its prefills stall them, and its closed loop runs more clients per engine
(`clients_per_engine`, drawn) to keep several decoding on each engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from load.bench_routing.trace import RoutedSpec
from load.loadgen.text import Text, Vocab
from load.loadgen.workloads import Message

Session = tuple[RoutedSpec, ...]

# Closed-loop clients per engine, unless the shape draws its own (`params["clients_per_engine"]`).
CLIENTS_PER_ENGINE = 3


def _rng(seed: int, *key: object) -> random.Random:
    return random.Random(f"suite:{seed}:" + ":".join(map(str, key)))


@dataclass
class Shape:
    """One shape at one seed: its drawn parameters and a deterministic session generator."""

    name: str
    vocab: Vocab
    seed: int
    params: dict[str, Any]
    # Sessions in progress at once when arrivals are open loop (each arrival is the next turn of the
    # next session in turn, so a session's turns come `active / rate` seconds apart).
    active: int
    _texts: dict[tuple[object, ...], Text] = field(default_factory=dict, repr=False)

    def text(self, words: int, *key: object) -> Text:
        """The same text every time `key` is asked for (shared prompts, a session's history)."""
        full = (words, *key)
        if full not in self._texts:
            self._texts[full] = self.vocab.text(_rng(self.seed, self.name, "text", *key), words)
        return self._texts[full]

    @property
    def clients_per_engine(self) -> int:
        """Closed-loop clients per engine: the suite's default, or the shape's own draw."""
        return int(self.params.get("clients_per_engine", CLIENTS_PER_ENGINE))

    def session(self, i: int) -> Session:
        return _BUILDERS[self.name](self, i)

    def sessions(self, start: int = 0) -> Iterator[Session]:
        i = start
        while True:
            yield self.session(i)
            i += 1

    def spec(self, messages: list[Message], user: str, shares: str, max_tokens: int) -> RoutedSpec:
        return RoutedSpec(self.name, tuple(messages), max_tokens, True, user=user, shares=shares)


def interleave(shape: Shape, count: int) -> list[RoutedSpec]:
    """The first `count` requests of open-loop arrivals: `shape.active` sessions in progress, arrivals
    going to them in turn; a finished session's slot takes the next session."""
    sessions = shape.sessions()
    slots: list[list[RoutedSpec]] = [list(next(sessions)) for _ in range(shape.active)]
    out: list[RoutedSpec] = []
    k = 0
    while len(out) < count:
        slot = slots[k % len(slots)]
        if not slot:
            slot[:] = next(sessions)
        out.append(slot.pop(0))
        k += 1
    return out


# The shapes' builders: session i of the shape.


def _chat_on_a_shared_prompt(
    shape: Shape, i: int, user: str, answer: Callable[[random.Random], tuple[int, int]]
) -> Session:
    """Session i: a chat on one of the shape's shared system prompts; `answer` draws each turn's
    max_tokens and the length of the reply its history re-sends."""
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    which = rng.randrange(len(p["prompt_tokens"]))
    messages = [Message("system", shape.text(p["prompt_tokens"][which], "prompt", which))]
    out = []
    for t in range(rng.randint(*p["turns"])):
        messages.append(Message("user", shape.text(rng.randint(*p["user_tokens"]), "user", i, t)))
        max_tokens, reply = answer(rng)
        out.append(shape.spec(list(messages), f"{user}-{i}", f"prompt-{which}", max_tokens))
        messages.append(Message("assistant", shape.text(reply, "reply", i, t)))
    return tuple(out)


def _system_prompts(shape: Shape, i: int) -> Session:
    p = shape.params
    return _chat_on_a_shared_prompt(
        shape, i, "user", lambda rng: (p["output_tokens"], rng.randint(*p["reply_tokens"]))
    )


def _rag(shape: Shape, i: int) -> Session:
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    docs = rng.sample(range(len(p["doc_tokens"])), rng.randint(*p["docs_per_question"]))
    messages = [Message("system", shape.text(p["instruction_tokens"], "instruction"))]
    messages += [Message("user", shape.text(p["doc_tokens"][d], "doc", d)) for d in docs]
    messages.append(Message("user", shape.text(rng.randint(*p["question_tokens"]), "question", i)))
    return (shape.spec(messages, f"rag-{i}", f"doc-{docs[0]}", p["output_tokens"]),)


def _sessions(shape: Shape, i: int) -> Session:
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    messages = [Message("system", shape.text(rng.randint(*p["system_tokens"]), "system", i))]
    out = []
    for t in range(rng.randint(*p["turns"])):
        messages.append(Message("user", shape.text(rng.randint(*p["user_tokens"]), "user", i, t)))
        out.append(shape.spec(list(messages), f"session-{i}", "-", p["output_tokens"]))
        messages.append(Message("assistant", shape.text(rng.randint(*p["reply_tokens"]), "reply", i, t)))
    return tuple(out)


def _agentic(shape: Shape, i: int) -> Session:
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    messages = [
        Message("system", shape.text(p["tools_tokens"], "tools")),
        Message("user", shape.text(rng.randint(*p["task_tokens"]), "task", i)),
    ]
    out = []
    for t in range(rng.randint(*p["turns"])):
        out.append(shape.spec(list(messages), f"agent-{i}", "tools", p["output_tokens"]))
        messages.append(Message("assistant", shape.text(rng.randint(*p["call_tokens"]), "call", i, t)))
        messages.append(Message("user", shape.text(rng.randint(*p["result_tokens"]), "result", i, t)))
    return tuple(out)


def _no_sharing(shape: Shape, i: int) -> Session:
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    messages = [
        Message("system", shape.text(rng.randint(*p["system_tokens"]), "system", i)),
        Message("user", shape.text(rng.randint(*p["user_tokens"]), "user", i)),
    ]
    return (shape.spec(messages, f"solo-{i}", "-", p["output_tokens"]),)


def _zipf(shape: Shape, i: int) -> Session:
    p = shape.params
    rng = _rng(shape.seed, shape.name, "session", i)
    weights = [1 / (k + 1) ** p["exponent"] for k in range(len(p["prefix_tokens"]))]
    which = rng.choices(range(len(weights)), weights)[0]
    messages = [
        Message("system", shape.text(p["prefix_tokens"][which], "prefix", which)),
        Message("user", shape.text(rng.randint(*p["suffix_tokens"]), "suffix", i)),
    ]
    return (shape.spec(messages, f"zipf-{i}", f"prefix-{which}", p["output_tokens"]),)


def _long_answers(shape: Shape, i: int) -> Session:
    def answer(rng: random.Random) -> tuple[int, int]:
        # Each answer's length drawn apart (requests leave their engines at different times), and the
        # history re-sends one as long.
        n = rng.randint(*shape.params["output_tokens"])
        return n, n

    return _chat_on_a_shared_prompt(shape, i, "asker", answer)


_BUILDERS = {
    "system_prompts": _system_prompts,
    "rag": _rag,
    "sessions": _sessions,
    "agentic": _agentic,
    "no_sharing": _no_sharing,
    "zipf": _zipf,
    "long_answers": _long_answers,
}
SHAPES: tuple[str, ...] = tuple(_BUILDERS)


def _span(rng: random.Random, lo: int, hi: int, width: float = 0.5) -> tuple[int, int]:
    """A sub-range of [lo, hi]: its low end drawn, its width at least `width` of what is left."""
    a = rng.randint(lo, lo + (hi - lo) // 2)
    b = rng.randint(a + int((hi - a) * width), hi)
    return a, b


def draw_params(name: str, seed: int) -> tuple[dict[str, Any], int]:
    """The shape's parameters at this seed, and its open-loop sessions in progress."""
    rng = _rng(seed, name, "params")
    out = rng.randint(8, 40)
    if name == "system_prompts":
        prompts = [rng.randint(1200, 3000) for _ in range(rng.randint(2, 5))]
        params = {
            "prompt_tokens": prompts,
            "turns": _span(rng, 2, 6),
            "user_tokens": _span(rng, 20, 120),
            "reply_tokens": _span(rng, 10, 60),
            "output_tokens": rng.randint(8, 24),
        }
        return params, rng.randint(16, 40)
    if name == "rag":
        docs = [rng.randint(800, 2500) for _ in range(rng.randint(4, 10))]
        params = {
            "doc_tokens": docs,
            "docs_per_question": (1, rng.randint(2, 3)),
            "instruction_tokens": rng.randint(10, 60),
            "question_tokens": _span(rng, 10, 80),
            "output_tokens": out,
        }
        return params, 1
    if name == "sessions":
        params = {
            "system_tokens": _span(rng, 100, 600),
            "turns": _span(rng, 4, 10),
            "user_tokens": _span(rng, 40, 200),
            "reply_tokens": _span(rng, 80, 300),
            "output_tokens": out,
        }
        return params, rng.randint(8, 24)
    if name == "agentic":
        params = {
            "tools_tokens": rng.randint(300, 1200),
            "task_tokens": _span(rng, 50, 200),
            "turns": _span(rng, 3, 8),
            "call_tokens": _span(rng, 20, 60),
            "result_tokens": _span(rng, 100, 600),
            "output_tokens": rng.randint(16, 48),
        }
        return params, rng.randint(6, 16)
    if name == "no_sharing":
        params = {
            "system_tokens": _span(rng, 100, 2000),
            "user_tokens": _span(rng, 20, 300),
            "output_tokens": out,
        }
        return params, 1
    if name == "zipf":
        params = {
            "prefix_tokens": [rng.randint(400, 2000) for _ in range(rng.randint(30, 120))],
            "exponent": round(rng.uniform(0.8, 1.4), 2),
            "suffix_tokens": _span(rng, 20, 100),
            "output_tokens": out,
        }
        return params, 1
    if name == "long_answers":
        # Sized so that a closed loop's decoding histories (clients x up to ~2.5k tokens) fit the
        # main grid's 16k-token caches beside the shared prompts: decode-heavy, not a preemption test.
        params = {
            "prompt_tokens": [rng.randint(200, 1200) for _ in range(rng.randint(1, 4))],
            "turns": _span(rng, 1, 3),
            "user_tokens": _span(rng, 20, 200),
            "output_tokens": _span(rng, 64, 384),
            "clients_per_engine": rng.randint(4, 8),
        }
        return params, rng.randint(16, 48)
    raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")


def make_shape(name: str, vocab: Vocab, seed: int) -> Shape:
    params, active = draw_params(name, seed)
    return Shape(name, vocab, seed, params, active)
