"""The same chat and completion cases through the gateway in front of the real vLLM CPU engine (the
contract suite's tiny random-weight Llama): OpenAI-valid answers, streamed and not, and the parameter
effects that are deterministic on a real model. Its tokens are noise, so effects are shown by forcing
them: greedy decoding repeats one token, a +100 logit bias makes a token the only choice, a seed fixes a
sample.

The engine starts once per session (30-100 s; `real_vllm`, shared with the contract suite); `pytest -m
"not real_engine"` leaves it out.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.conformance.calls import ask
from tests.conformance.stacks import Gateway, parse_events

pytestmark = pytest.mark.real_engine

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def single_token(gw: Gateway, text: str) -> int:
    ids = gw.tokenize(prompt=text, add_special_tokens=False)["tokens"]
    assert len(ids) == 1, f"{text!r} is {len(ids)} tokens"
    return ids[0]


def test_answer_is_openai_valid_and_max_tokens_bounds_it(
    vllm_gateway: Gateway, api: str, stream: bool
) -> None:
    a = ask(vllm_gateway, api, stream, max_tokens=8, ignore_eos=True)
    assert a.text and a.finish_reason == "length"
    assert a.usage is not None and a.usage.completion_tokens == 8


def test_seed_repeats_a_sample_streamed_or_not(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    whole = ask(vllm_gateway, api, False, seed=1, max_tokens=12, ignore_eos=True)
    again = ask(vllm_gateway, api, stream, seed=1, max_tokens=12, ignore_eos=True)
    other = ask(vllm_gateway, api, stream, seed=2, max_tokens=12, ignore_eos=True)
    assert again.text == whole.text
    assert again.usage == whole.usage
    assert other.text != whole.text


def test_greedy_sampling_takes_the_likeliest_token(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(vllm_gateway, api, stream, temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    b = ask(vllm_gateway, api, stream, temperature=0, max_tokens=6, ignore_eos=True)
    assert a.text == b.text
    entries = a.logprobs[0]
    assert entries is not None and len(entries) == 6
    for entry in entries:
        assert entry.logprob == pytest.approx(max(entry.top.values()), abs=1e-4), entry


@pytest.mark.parametrize(
    "narrowing",
    [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}],
    ids=["top_k 1", "tiny top_p", "min_p 1"],
)
def test_sampling_filters_leave_the_likeliest_token(
    vllm_gateway: Gateway, api: str, stream: bool, narrowing: dict[str, Any]
) -> None:
    greedy = ask(vllm_gateway, api, stream, temperature=0, max_tokens=6, ignore_eos=True)
    sampled = ask(vllm_gateway, api, stream, seed=9, max_tokens=6, ignore_eos=True)
    assert sampled.text != greedy.text, "a plain sample is not the greedy answer"
    narrowed = ask(vllm_gateway, api, stream, seed=9, max_tokens=6, ignore_eos=True, **narrowing)
    assert narrowed.text == greedy.text


@pytest.mark.parametrize(
    "penalty",
    [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 2.0}],
    ids=["presence", "frequency", "repetition"],
)
def test_penalties_break_a_greedy_repetition(
    vllm_gateway: Gateway, api: str, stream: bool, penalty: dict[str, Any]
) -> None:
    greedy = ask(vllm_gateway, api, stream, temperature=0, max_tokens=6, ignore_eos=True)
    ids = vllm_gateway.tokenize(prompt=greedy.text, add_special_tokens=False)["tokens"]
    assert len(set(ids)) < len(ids), f"the tiny model's greedy answer repeats a token: {greedy.text!r}"
    penalized = ask(vllm_gateway, api, stream, temperature=0, max_tokens=6, ignore_eos=True, **penalty)
    assert penalized.text != greedy.text


def test_logit_bias_forces_and_forbids_tokens(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    token = single_token(vllm_gateway, " ocean")
    forced = ask(
        vllm_gateway, api, stream, seed=3, max_tokens=4, ignore_eos=True, logit_bias={str(token): 100}
    )
    assert forced.text == " ocean" * 4
    greedy = ask(vllm_gateway, api, stream, temperature=0, max_tokens=3, ignore_eos=True)
    first = vllm_gateway.tokenize(prompt=greedy.text, add_special_tokens=False)["tokens"][0]
    banned = ask(
        vllm_gateway, api, stream, temperature=0, max_tokens=3, ignore_eos=True, logit_bias={str(first): -100}
    )
    assert banned.text != greedy.text
    assert not banned.text.startswith(vllm_gateway.detokenize([first]))


def test_stop_string_ends_the_answer_before_it(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    base = ask(vllm_gateway, api, False, seed=4, max_tokens=16, ignore_eos=True)
    text = base.text
    stop = next(
        text[k : k + 3]
        for k in range(len(text) // 2, len(text) - 3)
        if text[k : k + 3].isascii() and text[k].strip()
    )
    a = ask(vllm_gateway, api, stream, seed=4, max_tokens=16, ignore_eos=True, stop=[stop])
    assert a.text == text[: text.index(stop)]
    assert a.finish_reason == "stop"


def test_stop_token_ids_end_on_that_token(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    token = single_token(vllm_gateway, " ocean")
    forced = {"seed": 5, "max_tokens": 6, "ignore_eos": True, "logit_bias": {str(token): 100}}
    a = ask(vllm_gateway, api, stream, stop_token_ids=[token], **forced)
    assert a.finish_reason == "stop"
    assert a.usage is not None and a.usage.completion_tokens == 1
    kept = ask(vllm_gateway, api, stream, stop_token_ids=[token], include_stop_str_in_output=True, **forced)
    assert kept.text == " ocean"
    # As vLLM: the stop token is not part of the text unless asked for.
    assert a.text == ""


def test_min_tokens_holds_off_a_stop_token(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    token = single_token(vllm_gateway, " ocean")
    a = ask(
        vllm_gateway,
        api,
        stream,
        seed=6,
        max_tokens=10,
        min_tokens=3,
        logit_bias={str(token): 100},
        stop_token_ids=[token],
    )
    # The stop token is masked for the first three tokens, then the bias makes it the next one.
    assert a.finish_reason == "stop"
    assert a.usage is not None and a.usage.completion_tokens == 4


def test_n_choices(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(vllm_gateway, api, stream, n=2, seed=7, max_tokens=6, ignore_eos=True)
    assert len(a.texts) == 2 and a.texts[0] != a.texts[1]
    assert a.finish_reasons == ["length", "length"]
    assert a.usage is not None and a.usage.completion_tokens == 12


def test_logprobs_shapes(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(vllm_gateway, api, stream, seed=8, max_tokens=5, ignore_eos=True, logprobs=3)
    entries = a.logprobs[0]
    assert entries is not None and len(entries) == 5
    assert "".join(e.token for e in entries) == a.text
    for e in entries:
        assert e.logprob <= 0
        if api == "chat":
            assert len(e.top_order) == 3
            assert e.top_order == sorted(e.top_order, reverse=True), "alternatives most likely first"
        else:
            # The legacy object is a map: the sampled token and the 3 likeliest, in no set order.
            assert e.top[e.token] == pytest.approx(e.logprob) and 3 <= len(e.top) <= 4


def test_repeated_long_prompt_reports_cached_tokens(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    prompt = f"{api} {stream}: " + " ".join(f"item{i}" for i in range(150))
    first = ask(vllm_gateway, api, stream, prompt, max_tokens=2)
    second = ask(vllm_gateway, api, stream, prompt, max_tokens=2)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 0 and cached % 128 == 0 and cached < second.usage.prompt_tokens


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_framing(vllm_gateway: Gateway, api: str, include_usage: bool) -> None:
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Hi."}]} if api == "chat" else {"prompt": "Hi."}
    )
    body = {
        "model": vllm_gateway.model,
        **prompt,
        "stream": True,
        "max_tokens": 3,
        "ignore_eos": True,
        "stream_options": {"include_usage": include_usage},
    }
    events = parse_events(vllm_gateway.sse(PATHS[api], body))
    usage = [e for e in events if e.get("usage")]
    if include_usage:
        assert usage == [events[-1]] and events[-1]["choices"] == []
        assert events[-1]["usage"]["completion_tokens"] == 3
    else:
        assert usage == []


def test_invalid_values_are_refused_with_their_param(vllm_gateway: Gateway, api: str, stream: bool) -> None:
    # 128256 tokens in the vocabulary: the engine has no token 200000 to bias.
    cases: list[tuple[dict[str, Any], str]] = [
        ({"temperature": -1}, "temperature"),
        ({"logit_bias": {"200000": 5}}, "logit_bias"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(vllm_gateway, api, stream, max_tokens=2, **fields)
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param, caught.value.body


# Structured outputs on the real engine: its grammar backend applies the constraint the gateway sent in
# `SamplingParams.constraint`, so even random weights write only what the constraint allows.
YES_NO_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def whitespace_tokens(gw: Gateway) -> list[int]:
    """The ids of the model's tokens that decode to whitespace only."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gw.model_dir / "tokenizer.json"))
    return [i for i in range(tokenizer.get_vocab_size()) if (t := tokenizer.decode([i])) and t.isspace()]


@pytest.mark.parametrize(
    ("extra", "valid"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "yes_no", "schema": YES_NO_SCHEMA, "strict": True},
                }
            },
            lambda text: json.loads(text)["answer"] in ("yes", "no") and set(json.loads(text)) == {"answer"},
        ),
        ({"guided_choice": ["sunny", "rainy"]}, lambda text: text in ("sunny", "rainy")),
        ({"structured_outputs": {"regex": "[0-9]{3}"}}, lambda text: len(text) == 3 and text.isdigit()),
    ],
    ids=["json_schema", "choice", "regex"],
)
def test_the_real_engine_honours_the_constraint(
    vllm_gateway: Gateway, api: str, extra: dict[str, Any], valid: Any
) -> None:
    # Random weights favour whitespace, which JSON allows between tokens without end: banning the
    # whitespace-only tokens leaves the grammar nothing but the JSON's own characters to choose from.
    no_whitespace = {str(i): -100 for i in whitespace_tokens(vllm_gateway)}
    body: dict[str, Any] = {
        "model": vllm_gateway.model,
        "max_tokens": 200,
        "seed": 3,
        "logit_bias": no_whitespace,
        **extra,
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "Will it rain?"}]
    else:
        body["prompt"] = "Will it rain? Answer:"
    status, answer = vllm_gateway.post(PATHS[api], body)
    assert status == 200, answer
    choice = answer["choices"][0]
    text = choice["message"]["content"] if api == "chat" else choice["text"]
    assert choice["finish_reason"] == "stop", (choice["finish_reason"], text)
    assert valid(text), text
