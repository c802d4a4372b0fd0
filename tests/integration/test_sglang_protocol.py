"""The OpenAI surface over SGLang engines (`SglangScheduler`), through the real stack: the control plane
detects the protocol, the gateway speaks it — Generate, n choices, logprobs, stop strings, Abort."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json, wait_for

MESSAGES = [{"role": "user", "content": "Tell me about the mountains."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with local_stack(FreePorts(), Path(tmp_path_factory.mktemp("sglang")), protocol="sglang") as s:
        yield s


def test_the_gateway_knows_its_engines_speak_sglang(stack: Stack) -> None:
    protocols = stack.gateway.gateway.endpoint_protocols(stack.model)
    assert sorted(a for a, _ in protocols) == sorted(stack.engines.addresses)
    assert {p for _, p in protocols} == {"sglang"}


def test_chat_streamed_and_not_agree(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    whole = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=16)
    chunks = list(
        client.chat.completions.create(
            model=stack.model,
            messages=MESSAGES,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert stack.generate_requests() == before + 2
    assert whole.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_n_choices_sample_with_sglangs_default_temperature(client: openai.OpenAI, stack: Stack) -> None:
    # No temperature given: SGLang's default (1.0) goes out, not proto3's 0 (greedy, which refuses n > 1).
    r = client.completions.create(
        model=stack.model, prompt="The mountain", n=3, max_tokens=10, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 3
    assert r.usage.completion_tokens == 30
    texts = ["", "", ""]
    for chunk in client.completions.create(
        model=stack.model,
        prompt="The mountain",
        n=3,
        max_tokens=10,
        stream=True,
        extra_body={"ignore_eos": True},
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert all(texts)


def test_logprobs_over_sglang(client: openai.OpenAI, stack: Stack) -> None:
    r = client.chat.completions.create(
        model=stack.model,
        messages=MESSAGES,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 8
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6
    c = client.completions.create(
        model=stack.model, prompt="Peaks", max_tokens=6, logprobs=1, extra_body={"ignore_eos": True}
    )
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text
    assert len(lp.token_logprobs) == len(lp.text_offset) == 6


def test_stop_strings_over_sglang(client: openai.OpenAI, stack: Stack) -> None:
    base = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=30, temperature=0)
    words = base.choices[0].message.content.split()
    stop = " " + words[len(words) // 2]
    cut = base.choices[0].message.content.index(stop)
    r = client.chat.completions.create(
        model=stack.model, messages=MESSAGES, max_tokens=30, temperature=0, stop=[stop]
    )
    assert r.choices[0].message.content == base.choices[0].message.content[:cut]
    assert r.choices[0].finish_reason == "stop"


def test_batched_prompts_over_sglang(client: openai.OpenAI, stack: Stack) -> None:
    prompts = ["The mountain", "A river"]
    kwargs = {"model": stack.model, "max_tokens": 5, "temperature": 0}
    batch = client.completions.create(prompt=prompts, **kwargs)
    alone = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in prompts]
    assert [c.text for c in batch.choices] == alone


def test_a_client_gone_mid_stream_gets_its_sglang_request_aborted(tmp_path: Path) -> None:
    with local_stack(
        FreePorts(), tmp_path, protocol="sglang", engines=1, sim=SimOptions(itl_ms=50.0)
    ) as slow:
        body = {
            "model": slow.model,
            "messages": MESSAGES,
            "stream": True,
            "max_tokens": 200,
            "ignore_eos": True,
        }
        conn = post_json(slow.base_url, "/v1/chat/completions", body)
        response = conn.getresponse()
        assert response.status == 200
        assert response.read(6) == b"data: "
        conn.close()
        engine = slow.engines.engines[0]
        assert wait_for(lambda: engine.stats.abort_calls == 1), "no SGLang Abort reached the engine"
        assert wait_for(lambda: engine.stats.active == 0), "the engine kept generating"
        assert engine.stats.completed == 0

        # A batch's calls are the gateway's own: a client gone cancels them.
        body = {"model": slow.model, "prompt": ["a", "b"], "max_tokens": 200, "ignore_eos": True}
        conn = post_json(slow.base_url, "/v1/completions", body)
        assert wait_for(lambda: engine.stats.active == 2), "the batch never reached the engine"
        conn.close()
        assert wait_for(lambda: engine.stats.active == 0, timeout=5), "the engine kept generating the batch"
        assert engine.stats.completed == 0


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """4 blocks of 16 tokens: a longer prompt is refused by the engine itself (INVALID_ARGUMENT)."""
    tmp = Path(tmp_path_factory.mktemp("sglang-small"))
    with local_stack(FreePorts(), tmp, protocol="sglang", engines=1, sim=SimOptions(num_blocks=4)) as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_an_sglang_engine_refusal_keeps_its_status(small: Stack, stream: bool) -> None:
    client = small.openai()
    before = small.generate_requests()
    with pytest.raises(openai.BadRequestError) as e:
        answer = client.completions.create(
            model=small.model, prompt="word " * 100, max_tokens=4, stream=stream
        )
        if stream:
            list(answer)
    assert "KV cache" in e.value.message
    assert small.generate_requests() == before + 1
