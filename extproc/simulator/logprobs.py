"""The next-token distribution behind the simulator's tokens, and the log-probabilities it reports.

The sampler (`sampler.py`) draws a token's identity from the plausible vocabulary; this module gives
every step a ranking that makes that draw a sample of a real distribution:

- rank r (1..`RANKS`) holds probability `HEAD * r^-1 / H(RANKS)` (about 0.25 for the first, 0.0125 for
  the twentieth); the other tokens of the vocabulary share the remaining `1 - HEAD` equally (the tail);
- the sampled token's rank is drawn from those probabilities, independently of its identity (which rank
  a token lands on is random), so the tokens are the ones the sampler always drew and asking for
  logprobs never changes them; a greedy request always takes rank 1;
- the other ranks hold distinct tokens drawn from the same vocabulary (never the sampled token, nor one
  the step masks), from a hash of (seed, step, slot): the same request yields the same alternatives, and
  a top-2 list is the start of the top-5 one;
- at the natural end of an answer EOS is rank 1 with probability `P_END` and the step always takes it
  (the simulator keeps answer lengths deterministic); the ordinary ranking shares the rest.

Prompt tokens get the same treatment per position from a hash of (previous token, position, token): a
prompt's logprobs depend on its tokens only, never on the request's seed.

Everything is computed only for requests that ask for logprobs, a few hash rounds per reported entry.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from extproc.simulator.vocab import PlausibleVocab

RANKS = 20  # vLLM's default max_logprobs: every top list a request may ask for is ranked
HEAD = 0.9  # the ranked tokens' share; the rest of the vocabulary shares 1 - HEAD
P_END = 0.9  # EOS's probability at the natural end of an answer
PUNCTUATION_RATE = 0.12  # how often a drawn token is punctuation (when punctuation may follow)

_HARMONIC = sum(1 / r for r in range(1, RANKS + 1))
RANK_PROBS = tuple(HEAD / (r * _HARMONIC) for r in range(1, RANKS + 1))
RANK_LOGPROBS = tuple(math.log(p) for p in RANK_PROBS)
_CUMULATIVE = tuple(sum(RANK_PROBS[: r + 1]) for r in range(RANKS))
_LOG_END = math.log(P_END)
_LOG_NOT_END = math.log(1 - P_END)

_MASK = (1 << 64) - 1
_TWO_64 = float(1 << 64)
_PROMPT_SALT = 0x5F3759DF


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's log-probability and the step's most likely tokens, most likely first (as many as the
    request asked for; each protocol arranges them its own way)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def mix(*parts: int) -> int:
    """A 64-bit hash of integers (splitmix64 rounds): stable across processes and Python versions."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = ((h ^ (part & _MASK)) * 0xBF58476D1CE4E5B9) & _MASK
        h = ((h ^ (h >> 29)) * 0x94D049BB133111EB) & _MASK
        h ^= h >> 32
    return h


def draw_rank(h: int) -> int | None:
    """The rank (1-based) a uniform 64-bit hash falls on, None for the tail."""
    u = h / _TWO_64
    rank = bisect.bisect_right(_CUMULATIVE, u)
    return rank + 1 if rank < RANKS else None


class Ranking:
    """One vocabulary's logprobs: the tail's share per token and the ranked alternatives."""

    def __init__(self, vocab: PlausibleVocab) -> None:
        self.vocab = vocab
        support = len(vocab.word_ids) + len(vocab.punctuation_ids)
        self.tail_logprob = math.log((1 - HEAD) / max(support - RANKS, 1))

    def rank_logprob(self, rank: int | None) -> float:
        return RANK_LOGPROBS[rank - 1] if rank is not None and rank <= RANKS else self.tail_logprob

    def alternatives(
        self, key: tuple[int, ...], punctuation: bool, excluded: Callable[[int], bool]
    ) -> Iterator[int]:
        """Distinct tokens for the ranks, in rank order, none of which `excluded` refuses."""
        words, marks = self.vocab.word_ids, self.vocab.punctuation_ids
        seen: set[int] = set()
        base = mix(*key)  # hashed once; each slot adds one round
        slot = 0
        # Bounded: a vocabulary where every token is excluded yields nothing rather than spinning.
        while slot < 64 * RANKS + len(seen) * 4:
            h = mix(base, slot)
            slot += 1
            if punctuation and marks and (h & 0xFFFF) < PUNCTUATION_RATE * 0x10000:
                token = marks[(h >> 16) % len(marks)]
            else:
                token = words[(h >> 16) % len(words)]
            if token in seen or excluded(token):
                continue
            seen.add(token)
            yield token

    def step(
        self,
        token: int,
        key: tuple[int, ...],
        k: int,
        *,
        greedy: bool,
        punctuation: bool,
        excluded: Callable[[int], bool],
        end_token: int | None = None,
    ) -> TokenLogprob:
        """A sampled token's entry: its rank (drawn from `key`, or 1 when greedy or it is the end
        token) and the top `k` of the step's ranking."""
        if end_token is not None:
            # EOS leads with P_END; the ordinary ranking follows, scaled by what is left.
            others = self.alternatives(key, punctuation, lambda t: t == end_token or excluded(t))
            top = [(end_token, _LOG_END)]
            for rank, other in zip(range(1, k), others, strict=False):
                top.append((other, _LOG_NOT_END + self.rank_logprob(rank)))
            return TokenLogprob(_LOG_END, tuple(top[:k]))
        rank = 1 if greedy else draw_rank(mix(*key, _MASK))
        return TokenLogprob(self.rank_logprob(rank), self._top(token, rank, key, k, punctuation, excluded))

    def prompt(self, prompt_ids: Sequence[int], position: int, k: int) -> TokenLogprob:
        """Position `position` (>= 1) of a prompt: its token's entry under the prefix before it."""
        token = prompt_ids[position]
        context = (_PROMPT_SALT, prompt_ids[position - 1], position)
        rank = draw_rank(mix(*context, token))
        top = self._top(token, rank, context, k, True, lambda t: False)
        return TokenLogprob(self.rank_logprob(rank), top)

    def _top(
        self,
        token: int,
        rank: int | None,
        key: tuple[int, ...],
        k: int,
        punctuation: bool,
        excluded: Callable[[int], bool],
    ) -> tuple[tuple[int, float], ...]:
        if k <= 0:
            return ()
        others = self.alternatives(key, punctuation, lambda t: t == token or excluded(t))
        top = []
        for position in range(1, k + 1):
            holder = token if position == rank else next(others, None)
            if holder is None:
                break
            top.append((holder, self.rank_logprob(position)))
        return tuple(top)
