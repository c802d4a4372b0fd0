"""CPU time of chat template + tokenization for one long chat message: native vs Python.

`python -m load.bench_tokenize` renders the default model's chat template (Llama 3 tokenizer) around one
user message of about 6,600 tokens and tokenizes it, many times, and prints the median CPU time per
request (`time.process_time`, so time in any thread counts) for:

- native, cache off: `extproc._native` template + the fast encoder, as on a first request;
- native, follow-up turn: the long message is history whose prompt is cached, a short turn is new (L1);
- native, same prompt: an exact repeat (L0);
- native tokenize only, and the `tokenizers` crate path (the fast encoder turned off is not exposed,
  so this is the Python `tokenizers` binding, which runs the crate);
- Python: `tokenizers.Tokenizer.encode` of the rendered prompt, and `transformers`'
  `apply_chat_template(tokenize=True)` (jinja2 + the same binding).

Two messages: random vocabulary words (the load generator's text, one token per word) and mixed prose,
code and non-Latin text. The reference is SMG's whole request for a 6,600-token prompt, 2.5 ms CPU on
this machine (docs: /work/shared/ARCHITECTURE.md). Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from extproc._native import Tokenizer
from extproc.models import default_model_dir
from load.loadgen.text import load_vocab

SMG_WHOLE_REQUEST_MS = 2.5
MIXED = (
    "The quarterly report (Q3, 2024) shows revenue of $1,234,567.89 — up 12.5% year over year. "
    "Grüße aus Köln; naïve café owners said «ça marche». 日本語のテキストも少し。한국어 문장도 있습니다. "
    "```python\ndef mean(xs: list[float]) -> float:\n    return sum(xs) / len(xs)\n```\n"
    "Emoji 👋🏽 and symbols → ≤ ≥ ± are here too.   Trailing   spaces,\ttabs and\n\nnewlines.\n"
)


def cpu_ms(call: Callable[[], object], repeats: int, inner: int) -> float:
    """Median over `repeats` samples of the CPU time of one call (each sample averages `inner` calls)."""
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(inner):
            call()
        samples.append((time.process_time() - start) / inner * 1000)
    return statistics.median(samples)


def messages_for(content: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": content},
    ]


def measure(name: str, content: str, model_dir: Path, repeats: int, inner: int) -> dict[str, float]:
    from tokenizers import Tokenizer as HfTokenizer
    from transformers import AutoTokenizer

    native = Tokenizer.from_model_dir(model_dir)
    messages = messages_for(content)
    body = json.dumps(messages)
    prompt = native.render_chat(body, add_generation_prompt=True)
    tokens = native.chat_prompt_len(body)
    hf = HfTokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert native.encode_uncached(prompt) == hf.encode(prompt, add_special_tokens=False).ids

    # The next request of the same conversation: the long message is history now, a short turn is new.
    follow_up = json.dumps(
        [
            *messages,
            {"role": "assistant", "content": "Done: it is long."},
            {"role": "user", "content": "Thanks!"},
        ]
    )

    def follow_up_ms() -> float:
        native.clear_cache()
        native.chat_prompt_len(body)
        start = time.process_time()
        native.chat_prompt_len(follow_up)
        return (time.process_time() - start) * 1000

    results: dict[str, float] = {"tokens": float(tokens)}
    native.set_cache_limits(0, 0)
    results["native template+tokenize, cache off"] = cpu_ms(
        lambda: native.chat_prompt_len(body), repeats, inner
    )
    results["native tokenize only, cache off"] = cpu_ms(
        lambda: native.count_tokens(prompt, cached=False), repeats, inner
    )
    results["native template only"] = cpu_ms(
        lambda: native.render_chat(body, add_generation_prompt=True), repeats, inner
    )
    native.set_cache_limits(4096, 128 << 20)
    results["native template+tokenize, follow-up turn (L1)"] = statistics.median(
        follow_up_ms() for _ in range(repeats * inner)
    )
    native.chat_prompt_len(body)
    results["native template+tokenize, same prompt (L0)"] = cpu_ms(
        lambda: native.chat_prompt_len(body), repeats, inner
    )
    results["python tokenizers encode"] = cpu_ms(
        lambda: hf.encode(prompt, add_special_tokens=False), repeats, max(1, inner // 4)
    )
    transformers_tok = AutoTokenizer.from_pretrained(model_dir)
    results["python transformers apply_chat_template(tokenize=True)"] = cpu_ms(
        lambda: transformers_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True),
        repeats,
        max(1, inner // 4),
    )
    print(f"\n{name}: {tokens} prompt tokens, {len(prompt.encode())} bytes")
    for label, value in results.items():
        if label != "tokens":
            ratio = value / SMG_WHOLE_REQUEST_MS
            print(f"  {label:<58} {value:8.3f} ms CPU  ({ratio:5.2f} x SMG's whole request)")
    return results


def main() -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # the long prompt exceeds the model's declared length
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=6600, help="approximate message length in tokens")
    parser.add_argument("--repeats", type=int, default=25, help="samples per measurement (median reported)")
    parser.add_argument("--inner", type=int, default=8, help="calls averaged per sample")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    model_dir = default_model_dir()
    words = load_vocab(model_dir / "tokenizer.json").text(random.Random(6600), args.tokens).content
    counter = Tokenizer.from_file(model_dir / "tokenizer.json")
    mixed = MIXED
    while counter.count_tokens(mixed) < args.tokens:
        mixed += MIXED
    while counter.count_tokens(mixed) > args.tokens:
        mixed = mixed[:-20]
    print(
        f"median CPU per request over {args.repeats} samples of {args.inner} calls; SMG reference "
        f"{SMG_WHOLE_REQUEST_MS} ms for its whole request at 6,600 tokens"
    )
    results = {
        "vocabulary words": measure("vocabulary words", words, model_dir, args.repeats, args.inner),
        "mixed text": measure("mixed text", mixed, model_dir, args.repeats, args.inner),
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
