"""The token cache: a conversation re-sent turn by turn only tokenizes its new turn; the GIL is free."""
# ruff: noqa: RUF001 (look-alike characters are the point here: full-width bars, long s, times sign)

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from extproc._native import Tokenizer

END_HEADER = "<|end_header_id|>"


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You answer arithmetic questions, showing your work."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: what is {turn} × {turn + 7}? Explain. 🧮"})
        if turn + 1 < turns:
            messages.append(
                {"role": "assistant", "content": f"{turn} × {turn + 7} = {turn * (turn + 7)}, because…"}
            )
    return messages


@pytest.fixture(scope="module")
def model_dir(make_model_dir: Callable[..., Path], template_source: Callable[[str], str]) -> Path:
    return make_model_dir("llama3", template=template_source("turns"))


def test_twenty_turns_tokenize_only_the_new_turn(model_dir: Path) -> None:
    native, hf = Tokenizer.from_model_dir(model_dir), AutoTokenizer.from_pretrained(model_dir)
    uncached = Tokenizer.from_model_dir(model_dir)
    uncached.set_cache_limits(0, 0)
    previous = ""
    for turns in range(1, 21):
        messages = conversation(turns)
        prompt = native.render_chat(json.dumps(messages), add_generation_prompt=True)
        before = native.cache_stats()
        ids = native.chat_ids(json.dumps(messages), add_generation_prompt=True)
        after = native.cache_stats()
        assert ids == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert ids == uncached.chat_ids(json.dumps(messages), add_generation_prompt=True)
        tokenized = after["tokenized_bytes"] - before["tokenized_bytes"]
        if turns == 1:
            assert tokenized == len(prompt.encode())
            previous = prompt
            continue
        # The previous prompt ended with the assistant header; everything up to its last special
        # token is reused, so only the answer, the new user turn and the new header are tokenized.
        shared = previous.rindex(END_HEADER) + len(END_HEADER)
        assert prompt.startswith(previous[:shared])
        assert tokenized == len(prompt[shared:].encode())
        assert after["l1_hits"] == before["l1_hits"] + 1
        assert after["l1_reused_ids"] - before["l1_reused_ids"] == len(
            hf.encode(previous[:shared], add_special_tokens=False)
        )
        previous = prompt
    # The same conversation again is an exact hit and tokenizes nothing.
    before = native.cache_stats()
    native.chat_ids(json.dumps(conversation(20)), add_generation_prompt=True)
    after = native.cache_stats()
    assert after["l0_hits"] == before["l0_hits"] + 1
    assert after["tokenized_bytes"] == before["tokenized_bytes"]
    assert uncached.cache_stats()["entries"] == 0
