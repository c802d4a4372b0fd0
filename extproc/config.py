"""Settings for every extproc command: defaults < config file (TOML) < environment (EXTPROC_*) < flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    # The ext_proc gRPC server: "host:port" or "unix:/path/to.sock".
    listen: str = "127.0.0.1:50051"
    # Hugging Face style model directory; None means the default model (extproc.models).
    model_dir: Path | None = None
    # Served model name; None means the model directory's name.
    model_name: str | None = None
    # Engine endpoints, each "grpc://host:port". Empty with `up` means: start simulated engines.
    engines: tuple[str, ...] = ()
    # Largest client request body accepted, in bytes (413 above it).
    max_body_bytes: int = 8 * MiB
    log_level: str = "info"
    # The local stack (`extproc up`).
    host: str = "127.0.0.1"
    port: int = 8080
    admin_port: int = 9901
    sim: int = 2
    sim_port: int = 50100
    envoy_log_level: str = "warning"
