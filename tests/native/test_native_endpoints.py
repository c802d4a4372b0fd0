"""`Gateway.set_endpoints`: each engine address carries the protocol it speaks and its data-parallel size."""

from __future__ import annotations

import pytest

from extproc import _native
from tests.conftest import DEFAULT_MODEL, default_gateway

MODEL = DEFAULT_MODEL


@pytest.fixture(scope="module")
def gateway() -> _native.Gateway:
    gateway = default_gateway(MODEL)
    return gateway


def test_pairs_default_to_vllm_and_triples_name_the_protocol(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(
        MODEL, [("10.0.0.1:9000", 16), ("10.0.0.2:9000", 0, "sglang"), ("10.0.0.3:9000", 0, "vllm")]
    )
    assert gateway.endpoint_protocols(MODEL) == [
        ("10.0.0.1:9000", "vllm"),
        ("10.0.0.2:9000", "sglang"),
        ("10.0.0.3:9000", "vllm"),
    ]
    assert sorted(gateway.endpoints(MODEL)) == ["10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9000"]


def test_an_engine_can_change_protocol_and_leave(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(MODEL, [("10.0.0.1:9000", 0, "vllm")])
    gateway.set_endpoints(MODEL, [("10.0.0.1:9000", 0, "sglang")])
    assert gateway.endpoint_protocols(MODEL) == [("10.0.0.1:9000", "sglang")]
    gateway.set_endpoints(MODEL, [])
    assert gateway.endpoint_protocols(MODEL) == []
    assert gateway.endpoints(MODEL) == []


def test_quadruples_give_a_data_parallel_engine_one_endpoint_per_rank(gateway: _native.Gateway) -> None:
    gateway.set_endpoints(
        MODEL,
        [
            ("10.0.0.1:9000", 16, "vllm", 3),
            ("10.0.0.2:9000", 0, "sglang", 1),
            ("10.0.0.3:9000", 0, "vllm", 0),
        ],
    )
    # Protocols stay per address; the router lists a DP engine's ranks.
    assert gateway.endpoint_protocols(MODEL) == [
        ("10.0.0.1:9000", "vllm"),
        ("10.0.0.2:9000", "sglang"),
        ("10.0.0.3:9000", "vllm"),
    ]
    assert sorted(gateway.endpoints(MODEL)) == [
        "10.0.0.1:9000#0",
        "10.0.0.1:9000#1",
        "10.0.0.1:9000#2",
        "10.0.0.2:9000",
        "10.0.0.3:9000",
    ]
    # Health by address covers every rank.
    assert gateway.set_health(MODEL, "10.0.0.1:9000", False)
    assert sorted(gateway.endpoints(MODEL)) == ["10.0.0.2:9000", "10.0.0.3:9000"]
    assert gateway.set_health(MODEL, "10.0.0.1:9000", True)
    # Loads go to one rank; a rank the engine lacks is unknown.
    load = _native.EngineLoad(running=1, waiting=0, kv_usage=0.5, max_running=8)
    assert gateway.report_load(MODEL, "10.0.0.1:9000", load, dp_rank=2)
    assert not gateway.report_load(MODEL, "10.0.0.1:9000", load, dp_rank=3)
    assert gateway.report_load(MODEL, "10.0.0.2:9000", load)
    assert gateway.reset_kv_events(MODEL, "10.0.0.1:9000")
    # Back to one rank: the address alone again.
    gateway.set_endpoints(MODEL, [("10.0.0.1:9000", 16, "vllm", 1)])
    assert gateway.endpoints(MODEL) == ["10.0.0.1:9000"]


@pytest.mark.parametrize(
    "item",
    [
        ("10.0.0.1:9000", 0, "vllm", -1),
        ("10.0.0.1:9000", 0, "vllm", 2, 0),
        ("10.0.0.1:9000", 0, "SGLang"),
        ("10.0.0.1:9000", 0, "trt"),
        ("10.0.0.1:9000",),
        ("10.0.0.1:9000", 0, None),
    ],
)
def test_anything_else_is_a_value_error_and_changes_nothing(gateway: _native.Gateway, item: tuple) -> None:
    gateway.set_endpoints(MODEL, [("10.0.0.9:9000", 0, "sglang")])
    with pytest.raises(ValueError):
        gateway.set_endpoints(MODEL, [("10.0.0.1:9000", 0), item])
    assert gateway.endpoint_protocols(MODEL) == [("10.0.0.9:9000", "sglang")]
    assert gateway.endpoints(MODEL) == ["10.0.0.9:9000"]
