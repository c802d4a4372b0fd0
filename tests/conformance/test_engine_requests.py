"""What the engine is asked for: the parameters the simulator does not act on (temperature, top_p, top_k,
min_p, penalties, logit_bias) must still reach the engine as the client sent them, in the engine's own
protocol (vLLM's `SamplingParams`, SGLang's), or a real engine would not apply them. The real engine's
tests (test_real_vllm.py) show the effects."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.calls import ask
from tests.conformance.stacks import Gateway

SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "repetition_penalty": 1.1,
}


def engine_request(gw: Gateway, response_id: str) -> Any:
    assert gw.spy is not None
    return gw.spy.request_for(response_id)


def test_sampling_parameters_reach_the_engine(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, max_tokens=4, logit_bias={"1234": -100, "4321": 5.5}, **SAMPLING)
    params = engine_request(gateway, a.id).sampling_params
    for name, value in SAMPLING.items():
        assert getattr(params, name) == pytest.approx(value), name
    biases = {int(k): v for k, v in params.logit_bias.items()}  # SGLang keys are strings
    assert biases == {1234: -100.0, 4321: 5.5}
    limit = params.max_tokens if gateway.protocol == "vllm" else params.max_new_tokens
    assert limit == 4


def test_stop_rules_reach_the_engine(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(
        gateway,
        api,
        stream,
        max_tokens=20,
        min_tokens=3,
        stop=["zz top", "qq"],
        stop_token_ids=[13, 11],
        ignore_eos=True,
        skip_special_tokens=False,
        include_stop_str_in_output=True,
        n=2,
    )
    request = engine_request(gateway, a.id)
    params = request.sampling_params
    assert list(params.stop) == ["zz top", "qq"] and list(params.stop_token_ids) == [13, 11]
    assert params.ignore_eos and not params.skip_special_tokens and params.n == 2
    assert request.stream == stream
    if gateway.protocol == "vllm":
        assert (params.max_tokens, params.min_tokens, params.include_stop_str_in_output) == (20, 3, True)
    else:
        assert (params.max_new_tokens, params.min_new_tokens, params.no_stop_trim) == (20, 3, True)


def test_left_out_parameters_get_the_engine_defaults(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, max_tokens=2)
    params = engine_request(gateway, a.id).sampling_params
    assert params.skip_special_tokens and not params.ignore_eos and params.n == 1
    if gateway.protocol == "vllm":
        # vLLM reads its optional temperature's absence, and top_p/top_k/penalty zeros, as its defaults.
        assert not params.HasField("temperature") and not params.HasField("seed")
        assert (params.top_p, params.top_k, params.repetition_penalty) == (0, 0, 0)
    else:
        # SGLang's proto3 fields have no presence: its own defaults must be sent.
        assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, -1)
        assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)


def test_logprobs_request_reaches_the_engine(gateway: Gateway, api: str, stream: bool) -> None:
    a = ask(gateway, api, stream, max_tokens=2, logprobs=3)
    request = engine_request(gateway, a.id)
    if gateway.protocol == "vllm":
        assert request.sampling_params.logprobs == 3
        assert not request.sampling_params.HasField("prompt_logprobs")
    else:
        assert request.return_logprob and request.top_logprobs_num == 3
        assert request.logprob_start_len == -1, "no prompt logprobs were asked for"
