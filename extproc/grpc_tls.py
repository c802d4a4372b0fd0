"""gRPC client channels over TLS from PEM files: extproc's own engine channels (health, model info, loads,
KV events) with the `engine_tls_*` settings, and `up`'s liveness probe of an extproc serving TLS with the
`extproc_tls_*` ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

ChannelOptions = list[tuple[str, Any]]


@dataclass(frozen=True)
class ClientTls:
    """Verify the server against `ca`; present `cert`/`key` (mutual TLS) when given; `server_name`: the
    SNI and the name the server's certificate must carry (None: the address dialled)."""

    ca: str
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a TLS client certificate needs both the certificate and its key")

    def credentials(self) -> grpc.ChannelCredentials:
        """Read the files now (a missing one raises OSError naming it)."""
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.key).read_bytes() if self.key else None,
            certificate_chain=Path(self.cert).read_bytes() if self.cert else None,
        )

    def options(self) -> ChannelOptions:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def engine_tls(
    ca: str | None, cert: str | None = None, key: str | None = None, server_name: str | None = None
) -> ClientTls | None:
    """The engine TLS settings as one value; None for plaintext. Settings that need the CA without it
    raise ValueError."""
    if ca is None:
        if cert or key or server_name:
            raise ValueError("engine_tls_cert, engine_tls_key and engine_tls_server_name need engine_tls_ca")
        return None
    return ClientTls(ca, cert, key, server_name)


def channel(target: str, tls: ClientTls | None, options: ChannelOptions) -> grpc.aio.Channel:
    """An asyncio channel to `target`, over TLS when `tls` is given."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=[*options, *tls.options()])
