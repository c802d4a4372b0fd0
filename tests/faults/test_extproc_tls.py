"""Envoy to extproc over mutual TLS, served by extproc itself (`listen_tls_cert`/`listen_tls_key`, and
`listen_tls_client_ca` requiring client certificates): the gateway's Envoy, generated with the
`extproc_tls_*` settings, verifies extproc and presents its certificate, and completions flow. A client
with a certificate from another CA, without one, or speaking plaintext gets no ext_proc call through."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.envoy_bootstrap import UpstreamTls
from tests.conftest import FreePorts
from tests.faults.clients import chat
from tests.integration.harness import Stack, local_stack
from tests.integration.test_stack_up import running_up
from tests.tls_files import TlsFiles, make_tls_files


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("extproc-tls")))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("other-ca")))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, files: TlsFiles) -> Iterator[Stack]:
    serve_tls = {
        "listen_tls_cert": str(files.server_cert),
        "listen_tls_key": str(files.server_key),
        "listen_tls_client_ca": str(files.ca),
    }
    # The gateway's Envoy checks extproc's certificate (issued to localhost / 127.0.0.1) and presents its own.
    to_extproc = UpstreamTls(str(files.ca), str(files.client_cert), str(files.client_key))
    with local_stack(
        FreePorts(),
        Path(tmp_path_factory.mktemp("stack")),
        extproc_settings=serve_tls,
        envoy_overrides={"extproc_tls": to_extproc},
    ) as s:
        yield s


def test_envoy_reaches_extproc_over_mutual_tls(stack: Stack) -> None:
    for stream in (False, True):
        outcome = chat(stack, stream=stream, text=f"mtls {stream}")
        assert outcome.ok, outcome
    reply = stack.openai(timeout=30).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content


def _process_once(channel: grpc.Channel) -> Any:
    """One ext_proc stream with a request-headers message; the reply or the error."""
    stub = ep_grpc.ExternalProcessorStub(channel)
    message = ep.ProcessingRequest(request_headers=ep.HttpHeaders(end_of_stream=True))
    return next(iter(stub.Process(iter([message]), timeout=5)))


def _secure(stack: Stack, ca: Path, cert: Path | None, key: Path | None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(stack.gateway.address, credentials)


def test_a_client_certificate_from_the_right_ca_is_let_in(stack: Stack, files: TlsFiles) -> None:
    """The refusals below are the certificate's doing: the same call with Envoy's certificate works."""
    with _secure(stack, files.ca, files.client_cert, files.client_key) as channel:
        reply = _process_once(channel)
    assert reply.HasField("immediate_response") or reply.HasField("request_headers")


@pytest.mark.parametrize("client", ["another CA", "no certificate", "plaintext"])
def test_other_clients_get_no_ext_proc_call_through(
    stack: Stack, files: TlsFiles, other_ca: TlsFiles, client: str
) -> None:
    if client == "another CA":
        channel = _secure(stack, files.ca, other_ca.client_cert, other_ca.client_key)
    elif client == "no certificate":
        channel = _secure(stack, files.ca, None, None)
    else:
        channel = grpc.insecure_channel(stack.gateway.address)
    with channel, pytest.raises(grpc.RpcError) as refused:
        _process_once(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value  # type: ignore[attr-defined]
    # And extproc goes on serving Envoy.
    assert chat(stack, stream=False, text=f"after {client}").ok


def test_up_serves_extproc_over_mutual_tls_and_probes_it_so(
    tmp_path: Path, free_ports: Any, files: TlsFiles
) -> None:
    """`up` with the six settings: Envoy reaches extproc over mutual TLS, and the supervisor's liveness
    probe (every 0.5 s; 3 unanswered restart extproc) speaks TLS with Envoy's certificate too."""
    flags = ["--liveness-interval", "0.5"]
    flags += ["--listen-tls-cert", str(files.server_cert), "--listen-tls-key", str(files.server_key)]
    flags += ["--listen-tls-client-ca", str(files.ca), "--extproc-tls-ca", str(files.ca)]
    flags += ["--extproc-tls-cert", str(files.client_cert), "--extproc-tls-key", str(files.client_key)]
    with running_up(tmp_path, free_ports, *flags) as (up, port, log):
        time.sleep(4.0)  # eight probes
        body = {"model": "llama3-default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        text = log.read_text()
        assert up.poll() is None, text
        assert "did not answer" not in text and "restarting" not in text, text
