"""Envoy to extproc over mutual TLS, the production recipe of docs/operating.md ("Securing the ports"):
extproc serves plaintext on loopback, a TLS-terminating proxy (here a second Envoy with a TCP proxy that
requires client certificates) sits in front of it, and the gateway's Envoy, generated with the
`extproc_tls_*` settings, verifies the proxy and presents its own certificate. Completions flow; a client
without a certificate gets nothing from the proxy."""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from extproc.envoy_bootstrap import UpstreamTls, split_host_port
from tests.conftest import FreePorts
from tests.faults.envoy_stats import stat
from tests.integration.harness import envoy_running, local_stack
from tests.tls_files import make_tls_files

_TYPE = "type.googleapis.com/"


def _tls_proxy(port: int, admin_port: int, extproc: str, cert: Path, key: Path, ca: Path) -> dict[str, Any]:
    """An Envoy that terminates mutual TLS on `port` and forwards the bytes to extproc."""
    host, extproc_port = split_host_port(extproc)
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [
                    {"certificate_chain": {"filename": str(cert)}, "private_key": {"filename": str(key)}}
                ],
                "validation_context": {"trusted_ca": {"filename": str(ca)}},
            },
        },
    }
    tcp_proxy = {
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "to_extproc",
            "cluster": "extproc",
        },
    }
    address = {"socket_address": {"address": host, "port_value": extproc_port}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "tls_in",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [{"transport_socket": tls, "filters": [tcp_proxy]}],
                }
            ],
            "clusters": [
                {
                    "name": "extproc",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_assignment": {
                        "cluster_name": "extproc",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
                    },
                }
            ],
        },
    }


def test_envoy_reaches_extproc_through_a_mutual_tls_proxy(tmp_path: Path) -> None:
    ports = FreePorts()
    files = make_tls_files(tmp_path / "tls")
    proxy_port, proxy_admin = ports.one(), ports.one()
    # The gateway's Envoy presents the client certificate and checks the proxy's (issued to localhost).
    to_extproc = UpstreamTls(str(files.ca), str(files.client_cert), str(files.client_key), "localhost")
    overrides = {"extproc_target": f"127.0.0.1:{proxy_port}", "extproc_tls": to_extproc}
    (tmp_path / "stack").mkdir()
    with local_stack(ports, tmp_path / "stack", envoy_overrides=overrides) as stack:
        config = tmp_path / "proxy.json"
        proxy = _tls_proxy(
            proxy_port, proxy_admin, stack.gateway.address, files.server_cert, files.server_key, files.ca
        )
        config.write_text(json.dumps(proxy))
        with envoy_running(config, proxy_admin):
            reply = stack.openai(timeout=30).chat.completions.create(
                model=stack.model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert reply.choices[0].message.content
            proxy_admin_url = f"http://127.0.0.1:{proxy_admin}"
            assert stat(proxy_admin_url, "tcp.to_extproc.downstream_cx_total") >= 1, "not through the proxy"

            # Without a client certificate the proxy lets nothing through.
            context = ssl.create_default_context(cafile=str(files.ca))
            context.set_alpn_protocols(["h2"])
            with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as raw:
                with pytest.raises((ssl.SSLError, ConnectionResetError)):
                    with context.wrap_socket(raw, server_hostname="localhost") as tls:
                        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                        tls.recv(100)  # TLS 1.3: the refusal arrives after the handshake
