"""The token ids a simulated engine draws its output from.

Output should detokenize to something that reads like text (so the gateway's detokenizer, stop-string
handling and usage counting see realistic pieces), without any model: the engine samples from the vocab
entries that decode to a leading space and a short lowercase word, with "." and "," now and then.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

_WORD = re.compile(r" [a-z]{2,10}")
_PUNCTUATION = (".", ",")


@dataclass(frozen=True)
class PlausibleVocab:
    word_ids: tuple[int, ...]
    punctuation_ids: tuple[int, ...]
    # Decoded text of every id above; byte-level tokens of this kind decode independently, so a
    # sequence's text is the concatenation (what stop-string matching relies on).
    text: dict[int, str]


@functools.cache
def load_tokenizer(tokenizer_json: Path) -> Tokenizer:
    """One tokenizer per file per process: every engine of a cluster shares it."""
    return Tokenizer.from_file(str(tokenizer_json))


@functools.cache
def load_vocab(tokenizer_json: Path) -> PlausibleVocab:
    """Scan the whole vocab once per process (about 0.1 s for Llama 3's 128k entries)."""
    tokenizer = load_tokenizer(tokenizer_json)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    decoded = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
    words = tuple(i for i, s in enumerate(decoded) if _WORD.fullmatch(s))
    # The first id per mark: tokenizers may hold duplicates (added tokens) we do not want.
    punctuation = tuple(decoded.index(mark) for mark in _PUNCTUATION if mark in decoded)
    if not words:
        raise ValueError(f"{tokenizer_json} has no ' word' tokens to simulate output with")
    text = {i: decoded[i] for i in (*words, *punctuation)}
    return PlausibleVocab(words, punctuation, text)
