"""The routing benchmark's arrival trace: three kinds of prefix sharing, interleaved, with Poisson arrivals.

Every request is a function of (seed, its position in its kind's stream), so every policy and gateway
gets the same prompts at the same times. Prompts are random words of the real Llama 3 vocabulary, one
token each (see `load.loadgen.text`), so their lengths in tokens are known without tokenizing.

- `chat`: multi-turn conversations. CONVERSATIONS are in progress at once; chat arrivals go to them in
  turn, so each conversation's next turn comes several seconds after its last one, re-sending the whole
  history (a short system prompt every chat shares, then each earlier user turn and the assistant's
  reply) plus a new user turn. A conversation ends after 3-8 turns and a new one takes its place.
- `system`: many users (USERS) sharing a few long system prompts (SYSTEM_PROMPTS, skewed popularity),
  each request with a unique user message.
- `rag`: a shared document set (DOCUMENTS of 2-4k tokens, skewed popularity) as the system message, then
  a unique question.

Each request carries a session key in the OpenAI `user` field (the conversation, or the user), which is
what consistent hashing keys on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from load.loadgen.runner import poisson_arrivals
from load.loadgen.text import Text, Vocab
from load.loadgen.workloads import ChatSpec, Message

# Share of arrivals per kind.
MIX: tuple[tuple[str, float], ...] = (("chat", 0.4), ("system", 0.3), ("rag", 0.3))

# Multi-turn chats.
CONVERSATIONS = 16
CHAT_SYSTEM_WORDS = 40
TURNS = (3, 8)
USER_WORDS = (60, 140)
ASSISTANT_WORDS = (120, 220)

# Shared system prompts: lengths in words (= tokens) and relative popularity.
SYSTEM_PROMPTS: tuple[tuple[int, float], ...] = ((1200, 4), (1500, 3), (1800, 2), (2000, 1))
USERS = 400
SYSTEM_USER_WORDS = (40, 160)

# RAG: document lengths in words and relative popularity (Zipf-like), question length.
DOCUMENTS: tuple[tuple[int, float], ...] = (
    (2000, 6),
    (2400, 5),
    (2800, 4),
    (3200, 3),
    (3600, 2),
    (4000, 1),
)
QUESTION_WORDS = (20, 60)

OUTPUT_TOKENS = 32


@dataclass(frozen=True)
class RoutedSpec(ChatSpec):
    """A chat request with its session key (the `user` field) and what it shares with others."""

    user: str = ""
    # The shared part it re-uses: "conv-12", "system-1", "doc-3" (for breakdowns and tests).
    shares: str = ""


@dataclass(frozen=True)
class Trace:
    specs: tuple[RoutedSpec, ...]
    arrivals: tuple[float, ...]
    rate: float
    duration_s: float

    def __len__(self) -> int:
        return len(self.specs)

    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.specs)


def _rng(seed: int, *key: object) -> random.Random:
    # A str seed hashes deterministically (sha512), unlike hash() of a tuple across processes.
    return random.Random(f"routing:{seed}:" + ":".join(map(str, key)))


class _Builder:
    """Builds the three streams' requests in arrival order, keeping the chats' state."""

    def __init__(self, vocab: Vocab, seed: int, output_tokens: int) -> None:
        self.vocab, self.seed, self.output_tokens = vocab, seed, output_tokens
        self._texts: dict[tuple[object, ...], Text] = {}
        # Per conversation slot: (conversation id, turns it will have, turns sent so far).
        self._slots = [self._new_conversation(slot) for slot in range(CONVERSATIONS)]
        self._next_conversation = CONVERSATIONS
        self._chats = 0

    def _text(self, words: int, *key: object) -> Text:
        """A text that is the same every time `key` is asked for (shared prompts, chat history)."""
        full = (words, *key)
        if full not in self._texts:
            self._texts[full] = self.vocab.text(_rng(self.seed, *key), words)
        return self._texts[full]

    def _new_conversation(self, conversation: int) -> list[int]:
        return [conversation, _rng(self.seed, "turns", conversation).randint(*TURNS), 0]

    def _spec(self, kind: str, messages: list[Message], user: str, shares: str) -> RoutedSpec:
        return RoutedSpec(kind, tuple(messages), self.output_tokens, True, user=user, shares=shares)

    def chat(self) -> RoutedSpec:
        slot = self._slots[self._chats % CONVERSATIONS]
        self._chats += 1
        if slot[2] >= slot[1]:
            slot[:] = self._new_conversation(self._next_conversation)
            self._next_conversation += 1
        conversation, _, turn = slot
        slot[2] += 1
        messages = [Message("system", self._text(CHAT_SYSTEM_WORDS, "chat-system"))]
        for t in range(turn + 1):
            words = _rng(self.seed, "chat-words", conversation, t)
            user_words, reply_words = words.randint(*USER_WORDS), words.randint(*ASSISTANT_WORDS)
            messages.append(Message("user", self._text(user_words, "user", conversation, t)))
            if t < turn:
                messages.append(Message("assistant", self._text(reply_words, "reply", conversation, t)))
        return self._spec("chat", messages, f"conv-{conversation}", f"conv-{conversation}")

    def system(self, i: int) -> RoutedSpec:
        rng = _rng(self.seed, "system", i)
        which = rng.choices(range(len(SYSTEM_PROMPTS)), [w for _, w in SYSTEM_PROMPTS])[0]
        system = self._text(SYSTEM_PROMPTS[which][0], "system-prompt", which)
        user = rng.randrange(USERS)
        question = self.vocab.text(rng, rng.randint(*SYSTEM_USER_WORDS))
        messages = [Message("system", system), Message("user", question)]
        return self._spec("system", messages, f"user-{user}", f"system-{which}")

    def rag(self, i: int) -> RoutedSpec:
        rng = _rng(self.seed, "rag", i)
        which = rng.choices(range(len(DOCUMENTS)), [w for _, w in DOCUMENTS])[0]
        document = self._text(DOCUMENTS[which][0], "document", which)
        user = rng.randrange(USERS)
        question = self.vocab.text(rng, rng.randint(*QUESTION_WORDS))
        messages = [Message("system", document), Message("user", question)]
        return self._spec("rag", messages, f"rag-user-{user}", f"doc-{which}")


def build_trace(
    vocab: Vocab, *, rate: float, duration_s: float, seed: int = 0, output_tokens: int = OUTPUT_TOKENS
) -> Trace:
    """Poisson arrivals at `rate` per second for `duration_s`, each of a kind drawn by MIX."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    arrivals = [t for t in poisson_arrivals(rate, int(rate * duration_s * 1.5) + 10, seed) if t < duration_s]
    return Trace(
        tuple(requests(vocab, len(arrivals), seed, output_tokens)), tuple(arrivals), rate, duration_s
    )


def requests(vocab: Vocab, count: int, seed: int = 0, output_tokens: int = OUTPUT_TOKENS) -> list[RoutedSpec]:
    """The first `count` requests of the interleaved stream (a trace without times: capacity probes)."""
    builder = _Builder(vocab, seed, output_tokens)
    kinds, weights = zip(*MIX, strict=True)
    picker = _rng(seed, "mix")
    counts = dict.fromkeys(kinds, 0)
    out: list[RoutedSpec] = []
    for _ in range(count):
        kind = picker.choices(kinds, weights)[0]
        i = counts[kind]
        counts[kind] += 1
        out.append(
            builder.chat() if kind == "chat" else builder.system(i) if kind == "system" else builder.rag(i)
        )
    return out


def working_set_tokens() -> dict[str, int]:
    """Tokens the shared parts hold at once (prompts, documents, conversations in progress at their
    average length): what the engines' KV caches would need to keep every reuse a hit."""
    avg_turns = sum(TURNS) / 2
    turn = sum(USER_WORDS) / 2 + sum(ASSISTANT_WORDS) / 2
    conversation = CHAT_SYSTEM_WORDS + turn * avg_turns / 2
    return {
        "system_prompts": sum(n for n, _ in SYSTEM_PROMPTS),
        "documents": sum(n for n, _ in DOCUMENTS),
        "conversations": int(CONVERSATIONS * conversation),
    }
