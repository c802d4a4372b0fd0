"""Reading EndpointSlices: the engines a slice names, on which port, ready or draining."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.discovery.endpointslices import merge, slice_engines, slice_port
from tests.discovery.fake_kube_api import DRAINING, READY, endpoint_slice

PORTS = [("metrics", 9090), ("grpc", 8001)]


def test_ready_endpoints_take_requests_and_draining_ones_are_kept_without_new_ones() -> None:
    obj = endpoint_slice(
        "vllm-abc",
        "vllm",
        [
            ("10.0.0.1", READY),
            ("10.0.0.2", DRAINING),
            ("10.0.0.3", {"ready": False}),  # starting, or failing its readiness probe
            ("10.0.0.4", {"ready": True, "terminating": True}),  # publishNotReadyAddresses
            ("10.0.0.5", {}),  # no conditions: ready, as the API asks consumers to read it
        ],
        PORTS,
    )
    found = slice_engines(obj, "grpc")
    assert found.problem is None
    assert found.ready == {
        "10.0.0.1:8001": True,
        "10.0.0.2:8001": False,
        "10.0.0.3:8001": False,
        "10.0.0.4:8001": False,
        "10.0.0.5:8001": True,
    }


@pytest.mark.parametrize(
    ("ports", "wanted", "expected"),
    [
        (PORTS, "grpc", 8001),
        (PORTS, "metrics", 9090),
        (PORTS, 9090, 9090),
        (PORTS, None, 8001),  # several: the one named grpc
        ([("http", 8000)], None, 8000),  # one: that one
        ([(None, 8000)], None, 8000),  # unnamed
        ([], 8001, 8001),  # no ports defined: the number given
    ],
)
def test_the_port_is_chosen_by_name_or_number(
    ports: list[Any], wanted: str | int | None, expected: int
) -> None:
    assert slice_port([{"name": n, "port": p} for n, p in ports], wanted) == expected


@pytest.mark.parametrize(
    ("ports", "wanted", "problem"),
    [
        (PORTS, "http", "no port named 'http' among ['grpc', 'metrics']"),
        (PORTS, 8000, "no port 8000 among [8001, 9090]"),
        ([("a", 1), ("b", 2)], None, "several ports and none named 'grpc'"),
        ([], None, "no ports"),
    ],
)
def test_a_slice_without_the_port_names_no_engines_and_says_why(
    ports: list[Any], wanted: str | int | None, problem: str
) -> None:
    found = slice_engines(endpoint_slice("s", "vllm", [("10.0.0.1", READY)], ports), wanted)
    assert found.ready == {}
    assert found.problem is not None and found.problem.startswith(problem)


def test_ipv6_addresses_are_bracketed_and_only_the_first_address_of_an_endpoint_counts() -> None:
    obj = endpoint_slice("s", "vllm", [("fd00::7", READY)], [("grpc", 8001)], address_type="IPv6")
    obj["endpoints"][0]["addresses"].append("fd00::8")
    assert slice_engines(obj, None).ready == {"[fd00::7]:8001": True}


def test_fqdn_slices_and_malformed_endpoints_name_no_engines() -> None:
    fqdn = endpoint_slice("s", "vllm", [("engine.example", READY)], [("grpc", 1)], address_type="FQDN")
    assert slice_engines(fqdn, None).ready == {}
    assert "FQDN" in (slice_engines(fqdn, None).problem or "")
    broken = endpoint_slice("s", "vllm", [("not-an-ip", READY)], [("grpc", 1)])
    broken["endpoints"] += [{"addresses": []}, {"conditions": {}}, "junk"]
    assert slice_engines(broken, None).ready == {}


def test_an_engine_in_two_parts_takes_requests_if_either_says_so() -> None:
    assert merge([{"a:1": False, "b:1": True}, {"a:1": True}, {"c:1": False}]) == {
        "a:1": True,
        "b:1": True,
        "c:1": False,
    }
