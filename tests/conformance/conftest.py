"""Fixtures of the conformance suite (the stacks themselves are in `stacks.py`).

- `gateway` (session scope, parametrized over the engine protocol, "vllm" then "sglang"): one simulated
  engine behind extproc and a real Envoy; pytest runs every test of one protocol before starting the
  other's stack, so each starts once per session.
- `vllm_gateway` (module scope): extproc and Envoy in front of the session's real vLLM CPU engine
  (`real_vllm`, shared with the contract suite); its tests are marked `real_engine`.
- `api` ("chat", "completions") and `stream` (False, True) parametrize the tests that take them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from load.vllm_engine import VllmProcess
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
def vllm_gateway(real_vllm: VllmProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway in front of the real vLLM CPU engine (the tiny Llama), stopped when the module is done
    (the engine stays for the session)."""
    tmp = tmp_path_factory.mktemp("vllm-gw")
    with gateway_in_front_of([real_vllm.address], real_vllm.model_dir, tmp) as gw:
        yield gw


@pytest.fixture(params=["chat", "completions"])
def api(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["json", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param
