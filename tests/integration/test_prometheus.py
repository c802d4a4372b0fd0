"""A real Prometheus server (the Debian package, which .ci/run installs) scrapes a running gateway's
metrics port and answers a query on a gateway metric through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, wait_for


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail(
            "no `prometheus` binary: install the Debian package (`apt-get install prometheus`; .ci/run does)"
        )
    return found


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with local_stack(FreePorts(), tmp_path, engines=1) as s:
        s.gateway.serve_metrics("127.0.0.1", 0)
        yield s


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path, free_ports: FreePorts) -> Iterator[str]:
    binary = _prometheus_binary()
    assert stack.gateway.metrics is not None
    target = stack.gateway.metrics.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: extproc\n    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_ports.one()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            answer = json.load(r)
    except OSError:
        return []
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_the_gateway_and_answers_a_query(stack: Stack, prometheus: str) -> None:
    client = stack.openai()
    for _ in range(3):
        client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    query = f'sum(extproc_requests_total{{model="{stack.model}",status="200"}})'

    def answered() -> bool:
        result = _query(prometheus, query)
        return bool(result) and float(result[0]["value"][1]) >= 3

    assert wait_for(answered, timeout=60), f"Prometheus never answered {query} with 3 or more"
    (up,) = _query(prometheus, 'up{job="extproc"}')
    assert up["value"][1] == "1", "the scrape itself succeeded (the exposition text parsed)"
    durations = _query(prometheus, "gen_ai_server_request_duration_seconds_count")
    assert durations, "the GenAI histograms are queryable by their Prometheus names"
