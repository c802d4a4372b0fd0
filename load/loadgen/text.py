"""Prompt text drawn from a real tokenizer vocabulary, with its token ids known without tokenizing.

Every word is a vocab entry of the form " word" (Llama 3's byte-level BPE stores it as "Ġword"), so a run
of such words tokenizes to exactly one token per word: a prompt of N words is N tokens, for the gateway
under test and for the bare-engine floor, which gets the ids directly. The first word of a message loses
its leading space to the chat template's `trim`; its bare spelling is tokenized once and cached.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

_WORD = re.compile(r"Ġ[a-z]{3,12}")


@dataclass(frozen=True)
class Text:
    """Message content and the token ids it has once the template trimmed it."""

    content: str
    ids: tuple[int, ...]


class Vocab:
    def __init__(self, tokenizer_json: Path) -> None:
        with open(tokenizer_json, encoding="utf-8") as file:
            vocab: dict[str, int] = json.load(file)["model"]["vocab"]
        entries = sorted((i, token) for token, i in vocab.items() if _WORD.fullmatch(token))
        if not entries:
            raise ValueError(f"{tokenizer_json} has no 'Ġword' entries to build prompts from")
        self.ids = [i for i, _ in entries]
        self.words = [" " + token[1:] for _, token in entries]
        self._tokenizer_json = tokenizer_json

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self._tokenizer_json))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one Vocab per process; the cache lives as long)
    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of a small fixed string (template markup, a bare first word)."""
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, rng: random.Random, words: int) -> Text:
        """`words` random vocab words: `words` tokens once trimmed (give or take the first word)."""
        if words < 1:
            raise ValueError("a message needs at least one word")
        picks = rng.choices(range(len(self.ids)), k=words)
        first = self.words[picks[0]][1:]
        content = first + "".join(map(self.words.__getitem__, picks[1:]))
        ids = self.encode(first) + tuple(map(self.ids.__getitem__, picks[1:]))
        return Text(content, ids)


@functools.cache
def load_vocab(tokenizer_json: Path) -> Vocab:
    """One scan of the vocabulary per process (about half a second for Llama 3)."""
    return Vocab(tokenizer_json)
