"""Throwaway TLS files for tests, made with the openssl command line: a CA, a server certificate for
localhost / 127.0.0.1 and a client certificate, both signed by the CA (PEM, valid for two days)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def _signed(directory: Path, name: str, subject: str, extensions: str, ca: Path, ca_key: Path) -> None:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", *_KEY, "-keyout", key, "-out", csr, "-subj", subject)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
        "-out", cert, "-extfile", ext,
    )  # fmt: skip


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl(
        "req", "-x509", *_KEY, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=extproc test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    server_ext = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    _signed(directory, "server", "/CN=localhost", server_ext, ca, ca_key)
    _signed(directory, "client", "/CN=extproc test client", "extendedKeyUsage=clientAuth\n", ca, ca_key)
    return TlsFiles(
        ca=ca,
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
