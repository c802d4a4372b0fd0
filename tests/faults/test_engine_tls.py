"""Engines over mutual TLS: simulated engines serve gRPC over TLS and require a client certificate; Envoy
(the engines cluster's upstream TLS) and extproc (its own engine channels: health, model info, loads, KV
events; and the native server's Abort and batched calls) verify them against the CA and present the
gateway's certificate. Requests flow; a gateway trusting another CA fails cleanly (a 503 with an error,
at once, never a hang)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extproc.envoy_bootstrap import UpstreamTls
from extproc.simulator import SimOptions
from tests.conftest import FreePorts
from tests.faults.clients import chat
from tests.integration.harness import Stack, local_stack, post_json, wait_for
from tests.tls_files import TlsFiles, make_tls_files

# A refused handshake is answered within Envoy's connect attempt and a retry; a busy machine adds a little.
CLEAN_FAILURE_WITHIN_S = 5.0


@dataclass(frozen=True)
class Trust:
    """The TLS settings of a gateway: which CA it trusts, which certificate it presents."""

    ca: Path
    cert: Path
    key: Path

    def extproc(self) -> dict[str, Any]:
        return {
            "engine_tls_ca": str(self.ca),
            "engine_tls_cert": str(self.cert),
            "engine_tls_key": str(self.key),
        }

    def envoy(self) -> dict[str, Any]:
        return {"engine_tls": UpstreamTls(str(self.ca), str(self.cert), str(self.key))}


@pytest.fixture(scope="module")
def engines_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("engine-tls")))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("other-ca")))


def tls_engines(files: TlsFiles) -> SimOptions:
    return SimOptions(
        tls_cert=str(files.server_cert),
        tls_key=str(files.server_key),
        tls_client_ca=str(files.ca),
        record_calls=8,
    )


@pytest.fixture
def stack(tmp_path: Path, engines_tls: TlsFiles) -> Iterator[Stack]:
    trust = Trust(engines_tls.ca, engines_tls.client_cert, engines_tls.client_key)
    with local_stack(
        FreePorts(),
        tmp_path,
        engines=2,
        fallbacks=1,
        sim=tls_engines(engines_tls),
        extproc_settings=trust.extproc(),
        envoy_overrides=trust.envoy(),
    ) as s:
        yield s


def test_requests_reach_engines_over_mutual_tls(stack: Stack) -> None:
    assert len(stack.gateway.gateway.endpoints(stack.model)) == 2, "extproc's health checks over TLS failed"
    for stream in (False, True):
        outcome = chat(stack, stream=stream, text=f"over tls {stream}")
        assert outcome.ok, outcome
    # The KV events too: their native subscription presents the same client certificate.
    pool = stack.gateway.pool

    def batches() -> int:
        subscribers = [pool.kv_event_subscriber(e.address) for e in pool.engines]
        return sum(s.batches for s in subscribers if s is not None)

    assert wait_for(lambda: batches() > 0, 10), "no KV-event batch arrived over TLS"
    # Batched completions: the native server calls the engines itself, over its TLS channels.
    conn = post_json(
        stack.base_url,
        "/v1/completions",
        {"model": stack.model, "prompt": ["one", "two", "three"], "max_tokens": 2},
    )
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 200, body
    assert len(body["choices"]) == 3

    # A client hanging up mid-stream: the native server's Abort reaches the engine over TLS.
    aborts_before = sum(e.stats.abort_calls for e in stack.engines.engines)
    request = {"model": stack.model, "messages": [{"role": "user", "content": "long"}], "stream": True}
    request |= {"max_tokens": 5000, "ignore_eos": True}
    conn = post_json(stack.base_url, "/v1/chat/completions", request)
    response = conn.getresponse()
    assert response.status == 200
    assert response.read1(1024)
    conn.close()
    assert wait_for(lambda: sum(e.stats.abort_calls for e in stack.engines.engines) > aborts_before, 10), (
        "no Abort reached an engine"
    )


def _failure(stack: Stack) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    conn = post_json(
        stack.base_url,
        "/v1/chat/completions",
        {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    try:
        response = conn.getresponse()
        payload = json.loads(response.read())
    except (OSError, http.client.HTTPException) as e:
        raise AssertionError(f"no answer: {e!r}") from e
    finally:
        conn.close()
    return response.status, payload, time.monotonic() - started


def test_envoy_trusting_another_ca_fails_cleanly(
    tmp_path: Path, engines_tls: TlsFiles, other_ca: TlsFiles
) -> None:
    """extproc reaches the engines (right CA), Envoy does not (it trusts another CA): every request is a
    503 JSON error, at once."""
    good = Trust(engines_tls.ca, engines_tls.client_cert, engines_tls.client_key)
    wrong = Trust(other_ca.ca, engines_tls.client_cert, engines_tls.client_key)
    with local_stack(
        FreePorts(),
        tmp_path,
        engines=2,
        fallbacks=1,
        sim=tls_engines(engines_tls),
        extproc_settings=good.extproc(),
        envoy_overrides=wrong.envoy(),
    ) as stack:
        for _ in range(3):
            status, payload, seconds = _failure(stack)
            assert status == 503, payload
            assert payload["error"] == {
                "message": "the selected engine is unavailable",
                "type": "service_unavailable",
                "param": None,
                "code": 503,
            }
            assert seconds < CLEAN_FAILURE_WITHIN_S
        assert sum(e.stats.generate_requests for e in stack.engines.engines) == 0


def test_extproc_trusting_another_ca_sees_no_healthy_engine(
    tmp_path: Path, engines_tls: TlsFiles, other_ca: TlsFiles
) -> None:
    """extproc's own channels fail verification: no engine becomes healthy, and requests get extproc's
    503 naming the model, at once."""
    wrong = Trust(other_ca.ca, other_ca.client_cert, other_ca.client_key)
    with local_stack(
        FreePorts(),
        tmp_path,
        engines=1,
        sim=tls_engines(engines_tls),
        extproc_settings=wrong.extproc(),
        envoy_overrides=wrong.envoy(),
    ) as stack:
        assert stack.gateway.gateway.endpoints(stack.model) == []
        status, payload, seconds = _failure(stack)
        assert status == 503, payload
        assert stack.model in payload["error"]["message"], payload
        assert seconds < CLEAN_FAILURE_WITHIN_S
