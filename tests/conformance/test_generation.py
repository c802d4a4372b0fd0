"""Each generation parameter of /v1/chat/completions and /v1/completions, through the official client,
real Envoy and the gateway, against simulated engines of both protocols, streamed and not: the answer
parses with the client's models and the parameter's effect is what a vLLM user sees.

The simulator's tokens are deterministic per seed (per prompt without one) and its natural answers end
with EOS after 8-48 tokens, so a parameter's effect is compared against the same request without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.calls import Answer, ask
from tests.conformance.stacks import Gateway

NATURAL_MAX = 48  # the simulator's longest natural answer, in words (EOS comes after)


def eos_texts(gw: Gateway) -> set[str]:
    """How the model's end-of-sequence tokens read when special tokens are not skipped."""
    config = json.loads((Path(gw.model_dir) / "generation_config.json").read_text())
    ids = config["eos_token_id"]
    return {gw.detokenize([i]) for i in (ids if isinstance(ids, list) else [ids])}


def test_answer_has_the_openai_shape(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, seed=3)
    assert a.text.strip(), "the simulator answers in words"
    assert a.finish_reason == "stop", "a natural answer ends with EOS"
    assert a.usage is not None and 0 < a.usage.completion_tokens <= NATURAL_MAX + 1


def test_max_tokens_cuts_the_answer_with_length(gateway: Gateway, api: str, stream: bool) -> None:
    natural = ask(gateway, api, False, seed=5)
    assert natural.usage is not None and natural.usage.completion_tokens > 3
    cut = ask(gateway, api, stream, seed=5, max_tokens=3)
    assert cut.usage is not None and cut.usage.completion_tokens == 3
    assert cut.finish_reason == "length"
    assert natural.text.startswith(cut.text) and len(cut.text) < len(natural.text)


def test_max_completion_tokens_bounds_a_chat_answer_over_max_tokens(gateway: Gateway, stream: bool) -> None:
    a = ask(gateway, "chat", stream, seed=5, max_completion_tokens=4)
    assert a.usage is not None and a.usage.completion_tokens == 4 and a.finish_reason == "length"
    # OpenAI deprecates max_tokens for max_completion_tokens; vLLM lets the latter win.
    both = ask(gateway, "chat", stream, seed=5, max_tokens=9, max_completion_tokens=4)
    assert both.usage is not None and both.usage.completion_tokens == 4 and both.text == a.text


def test_ignore_eos_runs_to_exactly_max_tokens(gateway: Gateway, api: str, stream: bool) -> None:
    limit = NATURAL_MAX + 20
    natural = ask(gateway, api, stream, seed=6, max_tokens=limit)
    assert natural.finish_reason == "stop"
    assert natural.usage is not None and natural.usage.completion_tokens < limit
    forced = ask(gateway, api, stream, seed=6, max_tokens=limit, ignore_eos=True)
    assert forced.usage is not None and forced.usage.completion_tokens == limit
    assert forced.finish_reason == "length"


def test_min_tokens_holds_off_the_end(gateway: Gateway, api: str, stream: bool) -> None:
    natural = ask(gateway, api, stream, seed=7)
    assert natural.usage is not None
    floor = natural.usage.completion_tokens + 10
    longer = ask(gateway, api, stream, seed=7, min_tokens=floor, max_tokens=floor + 40)
    assert longer.usage is not None and longer.usage.completion_tokens >= floor
    assert longer.finish_reason == "stop" and len(longer.text) > len(natural.text)


def middle_words(text: str) -> str:
    """Two words from the middle of `text`, with the space before them: a stop string that spans
    tokens (and so engine chunks)."""
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    assert len(spaces) >= 6, text
    middle = len(spaces) // 2
    return text[spaces[middle] : spaces[middle + 2]]


@pytest.mark.parametrize("form", ["string", "list"])
def test_stop_string_ends_the_answer_before_it(gateway: Gateway, api: str, stream: bool, form: str) -> None:
    base = ask(gateway, api, False, seed=11, max_tokens=30, ignore_eos=True)
    stop = middle_words(base.text)
    expected = base.text[: base.text.index(stop)]
    stops: str | list[str] = stop if form == "string" else ["<never appears>", stop]
    a = ask(gateway, api, stream, seed=11, max_tokens=30, ignore_eos=True, stop=stops)
    assert a.text == expected
    assert stop not in a.text
    assert a.finish_reason == "stop"
    assert a.usage is not None and a.usage.completion_tokens < 30


def test_include_stop_str_in_output_keeps_the_stop_string(gateway: Gateway, api: str, stream: bool) -> None:
    base = ask(gateway, api, False, seed=11, max_tokens=30, ignore_eos=True)
    stop = middle_words(base.text)
    a = ask(
        gateway,
        api,
        stream,
        seed=11,
        max_tokens=30,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=True,
    )
    assert a.text == base.text[: base.text.index(stop)] + stop
    assert a.finish_reason == "stop"


def stop_token(gw: Gateway, text: str) -> tuple[int, str]:
    """A token from the middle of `text` that does not occur before, and the text before it."""
    ids = gw.tokenize(prompt=text, add_special_tokens=False)["tokens"]
    for k in range(len(ids) // 2, len(ids)):
        if ids[k] not in ids[:k]:
            return ids[k], gw.detokenize(ids[:k])
    raise AssertionError(f"no fresh token in the second half of {text!r}")


def test_stop_token_ids_end_the_answer_on_that_token(gateway: Gateway, api: str, stream: bool) -> None:
    base = ask(gateway, api, False, seed=12, max_tokens=30, ignore_eos=True)
    token, before = stop_token(gateway, base.text)
    a = ask(gateway, api, stream, seed=12, max_tokens=30, ignore_eos=True, stop_token_ids=[token])
    assert a.finish_reason == "stop"
    assert a.usage is not None and a.usage.completion_tokens < 30
    # As vLLM: the stop token ends the answer and, like EOS, is not part of its text.
    assert a.text == before


def test_stop_token_ids_with_include_stop_str_in_output_keep_the_token(
    gateway: Gateway, api: str, stream: bool
) -> None:
    base = ask(gateway, api, False, seed=12, max_tokens=30, ignore_eos=True)
    token, before = stop_token(gateway, base.text)
    a = ask(
        gateway,
        api,
        stream,
        seed=12,
        max_tokens=30,
        ignore_eos=True,
        stop_token_ids=[token],
        include_stop_str_in_output=True,
    )
    assert a.finish_reason == "stop"
    assert a.text == before + gateway.detokenize([token])


def test_skip_special_tokens_false_shows_a_kept_eos(gateway: Gateway, api: str, stream: bool) -> None:
    eos = eos_texts(gateway)
    skipped = ask(gateway, api, stream, seed=13, include_stop_str_in_output=True)
    shown = ask(gateway, api, stream, seed=13, include_stop_str_in_output=True, skip_special_tokens=False)
    assert skipped.finish_reason == shown.finish_reason == "stop"
    assert not any(e in skipped.text for e in eos)
    assert any(shown.text == skipped.text + e for e in eos), (shown.text[-40:], eos)


def test_eos_is_not_part_of_the_text_even_with_special_tokens(
    gateway: Gateway, api: str, stream: bool
) -> None:
    default = ask(gateway, api, stream, seed=13)
    unskipped = ask(gateway, api, stream, seed=13, skip_special_tokens=False)
    assert unskipped.finish_reason == "stop"
    # vLLM leaves the token that stopped the answer out of its text unless include_stop_str_in_output.
    assert unskipped.text == default.text, unskipped.text[-40:]


def test_n_gives_n_distinct_choices_and_usage_sums_them(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, n=3, seed=21, max_tokens=6, ignore_eos=True)
    assert len(a.texts) == 3  # indexes 0, 1, 2 checked by `ask`
    assert all(a.texts) and len(set(a.texts)) == 3, a.texts
    assert a.finish_reasons == ["length"] * 3
    assert a.usage is not None and a.usage.completion_tokens == 18


# SGLang's protocol has no seed field (docs/openai.md): seeds are a vLLM-protocol feature.
@pytest.mark.parametrize("gateway", ["vllm"], indirect=True)
def test_seed_repeats_the_answer(gateway: Gateway, api: str, stream: bool) -> None:
    first = ask(gateway, api, stream, seed=31, temperature=1.0, max_tokens=12)
    second = ask(gateway, api, stream, seed=31, temperature=1.0, max_tokens=12)
    assert first.text == second.text


@pytest.mark.parametrize("gateway", ["vllm"], indirect=True)
def test_other_seeds_give_other_answers(gateway: Gateway, api: str, stream: bool) -> None:
    texts = {
        ask(gateway, api, stream, seed=seed, temperature=1.0, max_tokens=12).text for seed in (31, 32, 33)
    }
    assert len(texts) == 3, f"the seed changed nothing: {texts}"


def test_temperature_zero_takes_the_likeliest_token(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, temperature=0, logprobs=3, max_tokens=8, ignore_eos=True)
    b = ask(gateway, api, stream, temperature=0, logprobs=3, max_tokens=8, ignore_eos=True)
    assert a.text == b.text
    entries = a.logprobs[0]
    assert entries is not None and len(entries) == 8
    for entry in entries:
        assert entry.logprob == pytest.approx(max(entry.top.values())), entry


def test_no_logprobs_unless_asked(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, seed=40, max_tokens=4)
    assert a.logprobs == [None]


def check_logprobs(a: Answer, api: str, top: int, tokens: int) -> None:
    for index, text in enumerate(a.texts):
        entries = a.logprobs[index]
        assert entries is not None and len(entries) == tokens
        assert "".join(e.token for e in entries) == text
        for e in entries:
            assert e.logprob <= 0
            if api == "chat":
                assert len(e.top_order) == top
                assert e.top_order == sorted(e.top_order, reverse=True), "alternatives most likely first"
                if top:
                    assert e.logprob <= e.top_order[0] + 1e-6
            else:
                # The legacy object lists the sampled token among (up to `top` + 1) alternatives.
                assert e.top[e.token] == pytest.approx(e.logprob)
                assert 1 <= len(e.top) <= top + 1
        if api == "completions":
            offsets = a.text_offsets[index]
            assert offsets is not None and len(offsets) == tokens
            for e, offset in zip(entries, offsets, strict=True):
                assert text[offset : offset + len(e.token)] == e.token


@pytest.mark.parametrize("top", [0, 2, 5])
def test_logprobs_cover_each_token(gateway: Gateway, api: str, stream: bool, top: int) -> None:
    a = ask(gateway, api, stream, seed=41, max_tokens=6, ignore_eos=True, logprobs=top)
    assert a.usage is not None and a.usage.completion_tokens == 6
    check_logprobs(a, api, top, 6)


def test_logprobs_of_n_choices(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, seed=42, n=2, max_tokens=5, ignore_eos=True, logprobs=1)
    check_logprobs(a, api, 1, 5)


@pytest.mark.parametrize("n", [1, 2])
def test_streamed_answer_matches_the_json_one(gateway: Gateway, api: str, n: int) -> None:
    kwargs = {"seed": 61, "n": n, "max_tokens": 20, "logprobs": 2}
    whole = ask(gateway, api, False, **kwargs)
    streamed = ask(gateway, api, True, **kwargs)
    assert streamed.texts == whole.texts
    assert streamed.finish_reasons == whole.finish_reasons
    assert streamed.usage == whole.usage
    assert streamed.logprobs == whole.logprobs
    assert streamed.chunks > n, "the stream arrives in pieces"


def test_user_is_accepted_and_changes_nothing(gateway: Gateway, api: str, stream: bool) -> None:
    plain = ask(gateway, api, stream, seed=8, max_tokens=6)
    tagged = ask(gateway, api, stream, seed=8, max_tokens=6, user="user-1234")
    assert tagged.text == plain.text


def test_repeated_long_prompt_reports_cached_tokens(gateway: Gateway, api: str, stream: bool) -> None:
    # Unique per protocol, API and mode: the engine keeps its cache for the whole session.
    prompt = f"{gateway.protocol} {api} {stream}: " + " ".join(f"item{i}" for i in range(150))
    first = ask(gateway, api, stream, prompt, max_tokens=2)
    second = ask(gateway, api, stream, prompt, max_tokens=2)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 300
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    # Whole KV blocks of the prompt, never its last token.
    assert second.usage.prompt_tokens // 2 < cached < second.usage.prompt_tokens
