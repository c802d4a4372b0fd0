"""What a request says instead of plausible words: a scripted text or a constraint's output, as tokens.

The text is tokenized with the model's own tokenizer (special-token strings such as `<|eot_id|>` become
their ids where the tokenizer has them), and the sampler emits those tokens one per step, then EOS; the
usual stop rules still apply to every token (`max_tokens` truncates with "length", a stop token or stop
string inside the text ends it there).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tokenizers import Tokenizer

from extproc.simulator.constraints import Constraint

# Tokens of context when decoding one token's text: enough to complete a multi-byte character.
_PIECE_WINDOW = 4


@dataclass(frozen=True)
class PlannedTokens:
    tokens: tuple[int, ...]
    # Each token's text, in order (stop-string matching reads them).
    pieces: tuple[str, ...]


def tokenize(tokenizer: Tokenizer, text: str) -> PlannedTokens:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    windows = [ids[max(0, i - _PIECE_WINDOW) : i] for i in range(len(ids))]
    before = tokenizer.decode_batch(windows, skip_special_tokens=False)
    after = tokenizer.decode_batch(
        [[*w, t] for w, t in zip(windows, ids, strict=True)], skip_special_tokens=False
    )
    pieces = tuple(a[len(b) :] if a.startswith(b) else a for b, a in zip(before, after, strict=True))
    return PlannedTokens(tuple(ids), pieces)


class OutputPlan:
    """A request's planned output per choice seed: the scripted text when there is one and it satisfies
    the constraint (if any), else the constraint's output for that seed."""

    def __init__(self, tokenizer: Tokenizer, script: str | None, constraint: Constraint | None) -> None:
        if script is None and constraint is None:
            raise ValueError("an output plan needs a script or a constraint")
        self._tokenizer = tokenizer
        self.constraint = constraint
        self.script = (
            script if script is not None and (constraint is None or constraint.accepts(script)) else None
        )
        self._fixed = tokenize(tokenizer, self.script) if self.script is not None else None
        self._by_seed: dict[int, PlannedTokens] = {}

    def text(self, seed: int) -> str:
        if self.script is not None:
            return self.script
        assert self.constraint is not None
        return self.constraint.generate(random.Random(seed))

    def tokens(self, seed: int) -> PlannedTokens:
        if self._fixed is not None:
            return self._fixed
        planned = self._by_seed.get(seed)
        if planned is None:
            planned = self._by_seed[seed] = tokenize(self._tokenizer, self.text(seed))
        return planned
