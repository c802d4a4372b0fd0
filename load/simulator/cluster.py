"""Several simulated engines in one process, each a gRPC server on its own port.

A gateway fronts a fleet of workers; one process hosting N engines on consecutive ports (or free ones)
gives a load test that fleet without N processes. The tokenizer and vocab scan are loaded once and
shared, so adding an engine costs only a server.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from extproc.models import resolve_model_dir
from load.simulator.engine import EngineStats, VllmEngine
from load.simulator.model import load_model_spec
from load.simulator.options import DEFAULT_OPTIONS, SimOptions
from load.simulator.vocab import load_tokenizer, load_vocab

# How long stop() lets in-flight streams finish before cancelling them.
STOP_GRACE_S = 0.5


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class SimEngine:
    """One engine of a cluster: its servicer and the server hosting it."""

    servicer: VllmEngine
    server: grpc.aio.Server
    host: str
    port: int

    @property
    def stats(self) -> EngineStats:
        return self.servicer.stats

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


@dataclass
class SimCluster:
    engines: list[SimEngine] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [engine.address for engine in self.engines]

    async def stop(self, grace: float | None = STOP_GRACE_S) -> None:
        await asyncio.gather(*(engine.server.stop(grace) for engine in self.engines))


async def _serve(servicer: VllmEngine, host: str, port: int) -> SimEngine:
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    try:
        bound = server.add_insecure_port(format_address(host, port))
    except RuntimeError as e:  # recent grpcio raises where older ones returned 0
        raise OSError(f"cannot bind {format_address(host, port)}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot bind {format_address(host, port)}")
    await server.start()
    servicer.port = bound
    return SimEngine(servicer, server, host, bound)


async def start_engines(
    model_dir: Path,
    *,
    count: int,
    base_port: int,
    host: str = "127.0.0.1",
    model_name: str | None = None,
    options: SimOptions = DEFAULT_OPTIONS,
) -> SimCluster:
    """Start `count` engines on base_port, base_port+1, ... (base_port 0: each on a free port)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    directory = resolve_model_dir(model_dir)
    tokenizer_json = (directory / "tokenizer.json").resolve()
    spec = load_model_spec(
        directory,
        model_name=model_name,
        max_model_len=options.max_model_len,
        tokenizer=load_tokenizer(tokenizer_json),
    )
    vocab = load_vocab(tokenizer_json)
    cluster = SimCluster()
    try:
        for i in range(count):
            port = base_port + i if base_port else 0
            cluster.engines.append(await _serve(VllmEngine(spec, vocab, options), host, port))
    except BaseException:
        await cluster.stop(grace=None)
        raise
    return cluster
