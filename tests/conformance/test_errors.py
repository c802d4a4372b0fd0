"""Invalid values of each parameter are refused with a 400 naming the parameter (`param`), as the official
client raises them (`openai.BadRequestError`), streamed or not, before any engine sees the request."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conformance.calls import request_kwargs
from tests.conformance.stacks import Gateway

BOTH: list[tuple[str, dict[str, Any], str]] = [
    ("temperature below 0", {"temperature": -0.5}, "temperature"),
    ("temperature not a number", {"temperature": "hot"}, "temperature"),
    ("top_p 0", {"top_p": 0}, "top_p"),
    ("top_p above 1", {"top_p": 1.5}, "top_p"),
    ("top_k below -1", {"top_k": -2}, "top_k"),
    ("min_p above 1", {"min_p": 1.5}, "min_p"),
    ("presence_penalty above 2", {"presence_penalty": 2.5}, "presence_penalty"),
    ("frequency_penalty below -2", {"frequency_penalty": -3}, "frequency_penalty"),
    ("repetition_penalty 0", {"repetition_penalty": 0}, "repetition_penalty"),
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens fractional", {"max_tokens": 2.5}, "max_tokens"),
    ("min_tokens negative", {"min_tokens": -1}, "min_tokens"),
    ("min_tokens over max_tokens", {"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ("stop not text", {"stop": 5}, "stop"),
    ("stop list of numbers", {"stop": [1, 2]}, "stop"),
    ("stop_token_ids not ids", {"stop_token_ids": ["a"]}, "stop_token_ids"),
    ("ignore_eos not a boolean", {"ignore_eos": "yes"}, "ignore_eos"),
    ("skip_special_tokens not a boolean", {"skip_special_tokens": "no"}, "skip_special_tokens"),
    (
        "include_stop_str_in_output not a boolean",
        {"include_stop_str_in_output": 3},
        "include_stop_str_in_output",
    ),
    ("n 0", {"n": 0}, "n"),
    ("n above 1 with greedy sampling", {"n": 2, "temperature": 0}, "n"),
    ("seed not an integer", {"seed": "x"}, "seed"),
    ("logit_bias key not a token id", {"logit_bias": {"x": 1}}, "logit_bias"),
    ("logit_bias out of range", {"logit_bias": {"5": 200}}, "logit_bias"),
    # The model's vocabulary has 128,256 tokens: vLLM refuses a bias for a token it does not have.
    ("logit_bias token outside the vocabulary", {"logit_bias": {"200000": 5}}, "logit_bias"),
    ("user not a string", {"user": 5}, "user"),
    (
        "include_usage not a boolean",
        {"stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
    ),
]
CHAT: list[tuple[str, dict[str, Any], str]] = [
    ("top_logprobs without logprobs", {"top_logprobs": 3}, "top_logprobs"),
    ("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("logprobs not a boolean", {"logprobs": 3}, "logprobs"),
    ("max_completion_tokens 0", {"max_completion_tokens": 0}, "max_completion_tokens"),
    (
        "continue_final_message with add_generation_prompt",
        {"continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
    ),
    ("chat_template_kwargs not an object", {"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("no messages", {"messages": []}, "messages"),
]
COMPLETIONS: list[tuple[str, dict[str, Any], str]] = [
    ("logprobs above 20", {"logprobs": 21}, "logprobs"),
    ("logprobs a boolean", {"logprobs": True}, "logprobs"),
    ("echo not a boolean", {"echo": "x"}, "echo"),
    ("empty token prompt", {"prompt": []}, "prompt"),
    ("negative token id", {"prompt": [-1]}, "prompt"),
    ("token id outside the vocabulary", {"prompt": [10**9]}, "prompt"),
]
CASES = [("chat", *c) for c in BOTH + CHAT] + [("completions", *c) for c in BOTH + COMPLETIONS]


def create(gw: Gateway, api: str, stream: bool, fields: dict[str, Any]) -> Any:
    fields = dict(fields)
    prompt = fields.pop("prompt", "Hello.")
    # Raw values, as a client sends them: logprobs keeps its own shape here.
    logprobs = fields.pop("logprobs", None)
    kwargs = request_kwargs(gw, api, prompt, fields)
    if logprobs is not None:
        kwargs["logprobs"] = logprobs
    method = gw.client.chat.completions.create if api == "chat" else gw.client.completions.create
    return method(stream=stream, **kwargs)


@pytest.mark.parametrize(
    ("api", "fields", "param"), [c[:1] + c[2:] for c in CASES], ids=[f"{c[0]}: {c[1]}" for c in CASES]
)
def test_invalid_value_is_a_400_naming_the_parameter(
    gateway: Gateway, api: str, stream: bool, fields: dict[str, Any], param: str
) -> None:
    assert gateway.generate_requests is not None
    before = gateway.generate_requests()
    with pytest.raises(openai.BadRequestError) as caught:
        create(gateway, api, stream, fields)
    error = caught.value
    assert error.status_code == 400
    assert isinstance(error.body, dict) and error.body["param"] == param, error.body
    assert error.param == param and error.body["message"]
    assert error.body["type"] == "invalid_request_error"
    assert gateway.generate_requests() == before, "the engine never sees a refused request"


def test_a_request_over_the_context_is_a_400(gateway: Gateway, api: str, stream: bool) -> None:
    max_model_len = gateway.tokenize(prompt="x")["max_model_len"]
    with pytest.raises(openai.BadRequestError) as caught:
        create(gateway, api, stream, {"max_tokens": max_model_len})
    assert isinstance(caught.value.body, dict) and caught.value.body["param"], caught.value.body


def test_an_unknown_model_is_a_404_naming_it(gateway: Gateway, api: str, stream: bool) -> None:
    kwargs = request_kwargs(gateway, api, "Hello.", {})
    kwargs["model"] = "no-such-model"
    method = gateway.client.chat.completions.create if api == "chat" else gateway.client.completions.create
    with pytest.raises(openai.NotFoundError) as caught:
        method(stream=stream, **kwargs)
    assert caught.value.param == "model"
