"""More of the OpenAI surface through the real stack: completions, stop strings, echo, tokenize."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.integration.harness import Stack

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def post(stack: Stack, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{stack.base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        assert r.headers["content-type"] == "application/json"
        return json.load(r)


def test_completion_from_text_and_from_token_ids(client: openai.OpenAI, stack: Stack) -> None:
    from tokenizers import Tokenizer

    from extproc.models import default_model_dir

    ids = post(stack, "/v1/tokenize", {"model": stack.model, "prompt": "Once upon a time"})["tokens"]
    # Raw prompts get the tokenizer's own special tokens, as `tokenizer(prompt)` adds them.
    reference = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    assert ids == reference.encode("Once upon a time", add_special_tokens=True).ids
    from_text = client.completions.create(model=stack.model, prompt="Once upon a time", max_tokens=8, seed=3)
    from_ids = client.completions.create(model=stack.model, prompt=ids, max_tokens=8, seed=3)
    assert from_text.object == "text_completion"
    assert from_text.choices[0].text == from_ids.choices[0].text
    assert from_text.usage.prompt_tokens == len(ids) == from_ids.usage.prompt_tokens
    assert from_text.choices[0].finish_reason == "length"


def test_streamed_completion_matches_and_echo_prepends_the_prompt(
    client: openai.OpenAI, stack: Stack
) -> None:
    whole = client.completions.create(model=stack.model, prompt="Hello there", seed=5, echo=True)
    chunks = list(
        client.completions.create(model=stack.model, prompt="Hello there", seed=5, echo=True, stream=True)
    )
    streamed = "".join(c.choices[0].text for c in chunks)
    assert whole.choices[0].text.startswith("Hello there")
    assert len(whole.choices[0].text) > len("Hello there")
    assert streamed == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_text_before_it(client: openai.OpenAI, stack: Stack, stream: bool) -> None:
    base = client.chat.completions.create(model=stack.model, messages=MESSAGES, seed=11, max_tokens=30)
    words = base.choices[0].message.content.split()
    stop = words[len(words) // 2]
    cut = base.choices[0].message.content.index(" " + stop)
    kwargs = {"model": stack.model, "messages": MESSAGES, "seed": 11, "max_tokens": 30, "stop": [" " + stop]}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.chat.completions.create(**kwargs)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert text == base.choices[0].message.content[:cut]
    assert finish == "stop"


def test_tokenize_messages_and_detokenize_round_trip(stack: Stack) -> None:
    chat = post(
        stack, "/v1/tokenize", {"model": stack.model, "messages": MESSAGES, "return_token_strs": True}
    )
    assert chat["count"] == len(chat["tokens"]) == len(chat["token_strs"])
    assert chat["max_model_len"] == 8192
    assert chat["token_strs"][0] == "<|begin_of_text|>"
    text = post(stack, "/v1/detokenize", {"model": stack.model, "tokens": chat["tokens"]})["prompt"]
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTell me a story.")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_tokenize_never_reaches_an_engine(stack: Stack) -> None:
    before = stack.generate_requests()
    post(stack, "/v1/tokenize", {"model": stack.model, "prompt": "x"})
    post(stack, "/v1/detokenize", {"model": stack.model, "tokens": [1, 2]})
    assert stack.generate_requests() == before
