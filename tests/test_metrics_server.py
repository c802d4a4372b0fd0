"""The metrics HTTP server without a stack: every metric the Grafana dashboard queries is one the gateway
exports, the exposition text reads back, `/engines` lists a model's endpoints, a taken port is refused."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from extproc import metrics
from extproc.metrics_http import MetricsServer
from tests.conftest import DEFAULT_MODEL, default_gateway
from tests.integration.exposition import parse

DASHBOARD = Path(__file__).parent.parent / "deploy" / "grafana" / "extproc-dashboard.json"


def _exported() -> dict[str, str]:
    """Every metric `/metrics` declares (with its type), series or not."""
    return parse(metrics.render(default_gateway(), {})).types


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    exported = _exported()
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    # Metric names, not label names (those are followed by a matcher).
    names = {n for e in exprs for n in re.findall(r"\b(?:extproc|gen_ai)_[a-z_]+\b(?!\s*[=!])", e)}
    assert names
    for name in names:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in exported or exported.get(base) == "histogram", name


def test_the_genai_metrics_have_their_prometheus_names_and_types() -> None:
    exported = _exported()
    for name in [
        "gen_ai_client_token_usage",
        "gen_ai_server_request_duration_seconds",
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "extproc_phase_duration_seconds",
    ]:
        assert exported[name] == "histogram", name
    assert exported["extproc_requests_total"] == "counter"
    assert exported["extproc_engine_in_flight_requests"] == "gauge"


def test_the_server_answers_metrics_and_engines() -> None:
    gateway = default_gateway()
    gateway.set_endpoints(DEFAULT_MODEL, [("127.0.0.1:1", 16)])
    server = MetricsServer(gateway, {}, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as r:
            assert r.headers["Content-Type"] == metrics.CONTENT_TYPE
            scrape = parse(r.read().decode())
        labels = {"model": DEFAULT_MODEL, "engine": "127.0.0.1:1"}
        assert scrape.value("extproc_engine_healthy", **labels) == 1
        assert scrape.value("extproc_engine_in_flight_requests", **labels) == 0
        with urllib.request.urlopen(server.url + "/engines", timeout=5) as r:
            (engine,) = json.load(r)["engines"]
        assert engine["engine"] == "127.0.0.1:1" and engine["protocol"] == "vllm"
        assert engine["healthy"] is True and engine["penalty"] == "closed"
    finally:
        server.stop()


def test_a_taken_port_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            MetricsServer(default_gateway(), {}, "127.0.0.1", port)
