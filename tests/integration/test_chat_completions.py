"""Chat completions through the real stack (Envoy → extproc → simulated vLLM engines), driven by the
official `openai` client."""

from __future__ import annotations

import json
import urllib.request

import openai

from tests.integration.harness import Stack, generate_direct, post_json

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]


def test_models_lists_the_served_model(stack: Stack) -> None:
    with urllib.request.urlopen(f"{stack.base_url}/v1/models") as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/json"
        body = json.load(r)
    assert [m["id"] for m in body["data"]] == [stack.model]
    assert body["data"][0]["max_model_len"] == 8192


def test_models_through_the_client(client: openai.OpenAI, stack: Stack) -> None:
    assert [m.id for m in client.models.list()] == [stack.model]


def test_chat_completion(client: openai.OpenAI, stack: Stack) -> None:
    before = stack.generate_requests()
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=12)
    assert r.object == "chat.completion"
    assert r.model == stack.model
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert len(choice.message.content.split()) >= 4  # the simulator speaks in words
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert stack.generate_requests() == before + 1


def test_prompt_tokens_match_the_template_and_tokenizer(client: openai.OpenAI, stack: Stack) -> None:
    # The default template renders Llama 3 turn markup; the real tokenizer counts it.
    from tokenizers import Tokenizer

    from extproc.models import default_model_dir

    tok = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nSay something.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    n = len(tok.encode(expected, add_special_tokens=False).ids)
    r = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=1)
    assert r.usage.prompt_tokens == n


def prompt_ids(stack: Stack, messages: list[dict[str, str]]) -> list[int]:
    """The token ids the gateway sends an engine for `messages` (its `/v1/tokenize`)."""
    conn = post_json(stack.base_url, "/v1/tokenize", {"model": stack.model, "messages": messages})
    try:
        response = conn.getresponse()
        assert response.status == 200
        return json.load(response)["tokens"]
    finally:
        conn.close()


def test_streamed_and_non_streamed_answers_agree(client: openai.OpenAI, stack: Stack) -> None:
    # Whichever engine each request lands on, it meets the same prefix cache: every engine holds the
    # prompt already (sent straight to it, not through the router).
    prompt = prompt_ids(stack, MESSAGES)
    for engine in stack.engines.engines:
        stack.loop.run(generate_direct(engine, prompt))
    whole = client.chat.completions.create(model=stack.model, messages=MESSAGES, seed=7)
    assert whole.usage.prompt_tokens == len(prompt)
    assert whole.usage.prompt_tokens_details.cached_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model=stack.model, messages=MESSAGES, seed=7, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert finish == [whole.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert len({c.id for c in chunks}) == 1


def test_stream_arrives_incrementally_as_sse(stack: Stack) -> None:
    body = json.dumps({"model": stack.model, "messages": MESSAGES, "stream": True, "max_tokens": 5}).encode()
    req = urllib.request.Request(
        f"{stack.base_url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["x-request-id"]
        assert not [h for h in r.headers if h.lower().startswith("grpc-")]
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    # role chunk, 5 content chunks, finish chunk
    assert len(events) == 1 + 5 + 1 + 1
    assert "usage" not in json.loads(events[-2][len("data: ") :])


def test_response_headers_fit_the_client(stack: Stack) -> None:
    body = json.dumps({"model": stack.model, "messages": MESSAGES, "max_tokens": 2}).encode()
    req = urllib.request.Request(
        f"{stack.base_url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/json"
        request_id = r.headers["x-request-id"]
        assert request_id
        assert not [h for h in r.headers if h.lower().startswith("grpc-")]
        # The response id is the engine request's, unique per request: never the client's x-request-id.
        response_id = json.load(r)["id"]
        assert response_id.startswith("chatcmpl-extproc-") and request_id not in response_id


def test_client_cannot_choose_the_engine(stack: Stack) -> None:
    body = json.dumps({"model": stack.model, "messages": MESSAGES, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        f"{stack.base_url}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", "x-gateway-destination-endpoint": "127.0.0.1:9"},
    )
    with urllib.request.urlopen(req) as r:
        assert r.status == 200
