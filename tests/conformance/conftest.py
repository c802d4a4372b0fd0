"""Fixtures of the conformance suite (the stacks themselves are in `stacks.py`).

- `gateway` (session scope, parametrized over the engine protocol, "vllm" then "sglang"): one simulated
  engine behind extproc and a real Envoy; pytest runs every test of one protocol before starting the
  other's stack, so each starts once per session.
- `vllm_gateway` (module scope): extproc and Envoy in front of the real vLLM CPU engine of the contract
  suite; its tests are marked `real_engine`.
- `api` ("chat", "completions") and `stream` (False, True) parametrize the tests that take them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.stacks import (
    MODEL_NAME,
    PROTOCOLS,
    EngineSpy,
    Gateway,
    conformance_model,
    gateway_in_front_of,
)
from tests.conftest import FreePorts
from tests.integration.harness import SimModel, local_stack


@pytest.fixture(scope="session")
def spy() -> Iterator[EngineSpy]:
    with EngineSpy().installed() as s:
        yield s


@pytest.fixture(scope="session", params=PROTOCOLS)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, spy: EngineSpy
) -> Iterator[Gateway]:
    protocol = request.param
    tmp = tmp_path_factory.mktemp(f"conformance-{protocol}")
    model_dir = conformance_model(tmp / MODEL_NAME)
    # One engine: a repeated prompt always meets its own cached prefix.
    models = [SimModel(MODEL_NAME, engines=1, protocol=protocol, model_dir=model_dir)]
    with local_stack(FreePorts(), tmp, models=models, load_interval=0) as stack:
        yield Gateway(
            stack.base_url,
            stack.model,
            protocol,
            "sim",
            model_dir,
            spy=spy,
            generate_requests=stack.generate_requests,
        )


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The real vLLM CPU engine (the contract suite's tiny Llama), stopped when the module is done."""
    from load.vllm_engine import start_vllm
    from load.vllm_engine.tiny_model import ensure_tiny_model

    model_dir = ensure_tiny_model()
    with start_vllm(model_dir=model_dir) as engine:
        with gateway_in_front_of([engine.address], model_dir, tmp_path_factory.mktemp("vllm-gw")) as gw:
            yield gw


@pytest.fixture(params=["chat", "completions"])
def api(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["json", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param
