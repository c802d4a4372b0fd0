"""Clients over TLS (issue 15: "TLS for clients ... configurable"): with `tls_cert`/`tls_key` Envoy serves
HTTPS, and the official OpenAI client trusting the CA gets completions, streamed and not; a client that does
not trust the CA, or speaks plain HTTP, gets nothing. With `tls_client_ca` a client must also present a
certificate that CA signed (mutual TLS)."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from extproc.envoy_bootstrap import ServerTls
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack
from tests.tls_files import TlsFiles, make_tls_files


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(Path(tmp_path_factory.mktemp("tls")))


@contextlib.contextmanager
def _tls_stack(tmp: Path, tls: ServerTls) -> Iterator[Stack]:
    with local_stack(FreePorts(), tmp, envoy_overrides={"tls": tls}) as stack:
        yield stack


def _https_url(stack: Stack) -> str:
    port = stack.base_url.rsplit(":", 1)[1]
    return f"https://localhost:{port}"


def _client(stack: Stack, context: ssl.SSLContext) -> openai.OpenAI:
    http = httpx2.Client(verify=context, timeout=30)
    url = f"{_https_url(stack)}/v1"
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)


def _chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    content = reply.choices[0].message.content
    assert content
    return content


def _trusting(files: TlsFiles, with_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    if with_client_cert:
        context.load_cert_chain(str(files.client_cert), str(files.client_key))
    return context


def test_clients_get_completions_over_tls(tmp_path: Path, tls_files: TlsFiles) -> None:
    tls = ServerTls(str(tls_files.server_cert), str(tls_files.server_key))
    with _tls_stack(tmp_path, tls) as stack:
        client = _client(stack, _trusting(tls_files))
        assert _chat(client, stack.model)
        chunks = client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        # A client that does not trust the CA refuses the server: it is the certificate given.
        with pytest.raises(openai.APIConnectionError):
            _chat(_client(stack, ssl.create_default_context()), stack.model)

        # Plain HTTP on the TLS port gets no HTTP answer.
        host, port = stack.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):
                assert not sock.recv(100).startswith(b"HTTP/"), "plain HTTP was answered"


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path, tls_files: TlsFiles) -> None:
    tls = ServerTls(str(tls_files.server_cert), str(tls_files.server_key), client_ca=str(tls_files.ca))
    with _tls_stack(tmp_path, tls) as stack:
        assert _chat(_client(stack, _trusting(tls_files, with_client_cert=True)), stack.model)
        with pytest.raises(openai.APIConnectionError):
            _chat(_client(stack, _trusting(tls_files)), stack.model)
