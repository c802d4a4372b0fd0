"""`Gateway.set_endpoints`: each engine address carries the protocol it speaks."""

from __future__ import annotations

import pytest

from extproc import _native
from extproc.models import default_model_dir, served_model_name

MODEL = served_model_name(default_model_dir())


@pytest.fixture(scope="module")
def gateway() -> _native.Gateway:
    gateway = _native.Gateway(max_body_bytes=1 << 20)
    gateway.add_model(MODEL, str(default_model_dir()))
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


@pytest.mark.parametrize(
    "item",
    [
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
