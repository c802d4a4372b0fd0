"""A real local stack for tests: simulated engines and the extproc server in a background event loop
(so tests can inspect the engines), and the real Envoy binary as a child process, all on free ports.

`local_stack(ports, tmp)` serves one model on two vLLM-protocol engines; `protocol="sglang"` makes its
engines speak SGLang (the pool detects it); `models=[SimModel("a"), SimModel("b", protocol="sglang")]`
serves several models, each on engines of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import grpc
import openai
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang_pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sglang_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vllm_grpc

from extproc import server
from extproc.config import EngineConfig, ModelConfig, Settings
from extproc.envoy_bootstrap import EnvoyOptions, build_bootstrap, envoy_binary, response_module
from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.cluster import STOP_GRACE_S, SimEngine

SimProtocol = Literal["vllm", "sglang"]

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on its own thread, for servers that must keep running while tests block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class SimModel:
    """One served model of a test stack and its simulated engines."""

    name: str
    engines: int = 2
    protocol: SimProtocol = "vllm"
    # None: the default model's tokenizer and template.
    model_dir: Path | None = None
    routing_policy: str | None = None
    sim: SimOptions | None = None
    # What the gateway is told about the engines' protocol ("auto": it detects it).
    engine_protocol: str = "auto"
    # The model's tool-call and reasoning parsers (None: the global setting, "auto").
    tool_parser: str | None = None
    reasoning_parser: str | None = None


@dataclass
class Stack:
    base_url: str
    admin_url: str
    # The first (or only) model and its engines.
    model: str
    engines: SimCluster
    gateway: server.Running
    envoy: subprocess.Popen[bytes]
    loop: LoopThread
    # Every model's engines, by model name.
    clusters: dict[str, SimCluster] = field(default_factory=dict)
    # Where engine responses become answers: "ext_proc" (extproc) or "module" (inside Envoy).
    response_path: str = "ext_proc"

    def openai(self, timeout: float = 30.0) -> openai.OpenAI:
        """The official client against the stack's `/v1`, without its own retries (a test sees every
        failure)."""
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=timeout)

    def generate_requests(self) -> int:
        """How many Generate calls reached any engine of any model so far."""
        return sum(e.stats.generate_requests for c in self.clusters.values() for e in c.engines)


async def generate_direct(engine: SimEngine | str, tokens: list[int], max_tokens: int = 1) -> None:
    """One vLLM Generate straight to an engine (not through the gateway), read to its end: the engine
    caches the prompt and publishes its blocks."""
    address = engine if isinstance(engine, str) else engine.address
    async with grpc.aio.insecure_channel(address) as channel:
        request = vllm_pb.GenerateRequest(
            request_id=f"direct-{tokens[0]}-{len(tokens)}",
            tokenized=vllm_pb.TokenizedInput(input_ids=tokens),
            sampling_params=vllm_pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        async for _ in vllm_grpc.VllmEngineStub(channel).Generate(request):
            pass


class DirectCalls:
    """Generate calls made straight to an engine, bypassing the gateway; cancelled on close."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.channel = grpc.aio.insecure_channel(engine.address)
        self.calls: list[Any] = []

    def start(self, n: int, *, prompt_len: int = 40, max_tokens: int = 10_000) -> None:
        for i in range(n):
            ids = [128000, *range(2000 + i * 100, 2000 + i * 100 + prompt_len - 1)]
            rid = f"direct-{len(self.calls)}"
            if self.engine.protocol == "vllm":
                request: Any = vllm_pb.GenerateRequest(
                    request_id=rid,
                    tokenized=vllm_pb.TokenizedInput(input_ids=ids),
                    sampling_params=vllm_pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    stream=True,
                )
                self.calls.append(vllm_grpc.VllmEngineStub(self.channel).Generate(request))
            else:
                request = sglang_pb.GenerateRequest(
                    request_id=rid,
                    tokenized=sglang_pb.TokenizedInput(input_ids=ids),
                    sampling_params=sglang_pb.SamplingParams(max_new_tokens=max_tokens, ignore_eos=True),
                    stream=True,
                )
                self.calls.append(sglang_grpc.SglangSchedulerStub(self.channel).Generate(request))

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        await self.channel.close()


async def until(predicate: Callable[[], bool], within_s: float = 10.0) -> None:
    """Wait (on the running loop) until `predicate()` holds; fail after `within_s`."""
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def post_json(
    base_url: str, path: str, body: Any, timeout: float = 10.0, headers: Mapping[str, str] | None = None
) -> http.client.HTTPConnection:
    """POST `body` as JSON to the stack, with `headers` besides the content type; the caller reads the
    response (`getresponse()`) when it wants (a queued stream answers only with its first token) or walks
    away (`close()`)."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json", **(headers or {})})
    return conn


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` from a test's thread until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def envoy_running(config: Path, admin_port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The real Envoy on `config`, ready, until the block ends (then terminated; killed after 10 s)."""
    argv = [envoy_binary(), "-c", str(config), "--log-level", "warning", "--use-dynamic-base-id"]
    argv += ["--concurrency", "1"]
    envoy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # With the response module Envoy loads every served model's tokenizer before it is ready: a
        # minute and more for several models on a busy machine.
        wait_ready(f"http://127.0.0.1:{admin_port}", envoy, timeout=120)
        yield envoy
    finally:
        envoy.terminate()
        try:
            envoy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            envoy.kill()
            envoy.wait()


def wait_ready(admin_url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{admin_url}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError("envoy did not become ready")


async def _start_clusters(
    models: Sequence[SimModel], default_sim: SimOptions | None
) -> dict[str, SimCluster]:
    clusters: dict[str, SimCluster] = {}
    try:
        for m in models:
            clusters[m.name] = await start_engines(
                m.model_dir or default_model_dir(),
                count=m.engines,
                base_port=0,
                model_name=m.name,
                options=m.sim or default_sim or SimOptions(),
                protocol=m.protocol,
            )
    except BaseException:
        await asyncio.gather(*(c.stop(grace=0) for c in clusters.values()))
        raise
    return clusters


async def _stop_clusters(clusters: dict[str, SimCluster], grace: float | None) -> None:
    await asyncio.gather(*(c.stop(grace) for c in clusters.values()))


@contextlib.contextmanager
def local_stack(
    ports: Any,
    tmp: Path,
    *,
    engines: int = 2,
    sim: SimOptions | None = None,
    routing_policy: str = "kv_events",
    max_body_bytes: int | None = None,
    protocol: SimProtocol = "vllm",
    models: Sequence[SimModel] | None = None,
    load_interval: float | None = None,
    fallbacks: int = 0,
    routing_config: str | None = None,
    filters_before: Callable[[list[str]], Sequence[dict[str, Any]]] | None = None,
    envoy_overrides: Mapping[str, Any] | None = None,
    api_keys_file: Path | None = None,
    extproc_settings: Mapping[str, Any] | None = None,
    response_path: str = "ext_proc",
) -> Iterator[Stack]:
    """`engines`, `protocol` and `sim` describe the single default model; `models` several instead.
    `fallbacks` > 0: Envoy knows every model's engines (one cluster) and follows up to that many
    fallbacks, as under `extproc up`; 0 leaves Envoy one address per request (ORIGINAL_DST).
    `filters_before`: given the first model's engine addresses, Envoy HTTP filters to run before ext_proc
    (as a gateway in front of extproc would). `envoy_overrides`: EnvoyOptions fields to set (timeouts,
    connection cap, TLS). `extproc_settings`: further extproc settings by name. `response_path`: "module"
    turns engine responses into answers inside Envoy (the extproc_envoy dynamic module)."""
    loop = LoopThread()
    single = models is None
    if models is None:
        models = [SimModel(default_model_dir().name, engines=engines, protocol=protocol)]
    clusters = loop.run(_start_clusters(models, sim))
    extra: dict[str, Any] = {}
    if max_body_bytes:
        extra["max_body_bytes"] = max_body_bytes
    if load_interval is not None:
        extra["load_interval"] = load_interval
    if routing_config is not None:
        extra["routing_config"] = routing_config
    if api_keys_file is not None:
        extra["api_keys_file"] = api_keys_file
    extra["response_path"] = response_path
    extra.update(extproc_settings or {})
    known: tuple[str, ...] = ()
    if fallbacks:
        known = tuple(a for cluster in clusters.values() for a in cluster.addresses)
        extra["destination_fallbacks"] = fallbacks
    if single:
        first = next(iter(clusters.values()))
        extra["engines"] = tuple(f"grpc://{a}" for a in first.addresses)
    else:
        extra["models"] = tuple(
            ModelConfig(
                name=m.name,
                model_dir=m.model_dir,
                engines=tuple(
                    EngineConfig(f"grpc://{a}", m.engine_protocol) for a in clusters[m.name].addresses
                ),
                routing_policy=m.routing_policy,
                tool_parser=m.tool_parser,
                reasoning_parser=m.reasoning_parser,
            )
            for m in models
        )
    settings = Settings(listen="127.0.0.1:0", routing_policy=routing_policy, **extra)
    try:
        # A dozen models' tokenizers load in well under a minute, unless the machine is busy.
        running = loop.run(server.start(settings, engine_wait_s=10), timeout=180)
    except BaseException:
        loop.run(_stop_clusters(clusters, 0))
        loop.close()
        raise
    port, admin_port = ports.one(), ports.one()
    max_request_bytes = max_body_bytes or Settings().max_body_bytes
    options = EnvoyOptions(
        listen_port=port,
        admin_port=admin_port,
        extproc_target=running.address,
        max_request_bytes=max_request_bytes,
        engines=known,
        engine_retries=fallbacks if known else 0,
        response_module=response_module(settings),
    )
    options = replace(options, **(envoy_overrides or {}))
    config = tmp / "envoy.json"
    bootstrap = build_bootstrap(options)
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    if filters_before is not None:
        hcm["http_filters"][:0] = list(filters_before(list(next(iter(clusters.values())).addresses)))
    config.write_text(json.dumps(bootstrap))
    try:
        with envoy_running(config, admin_port) as envoy:
            yield Stack(
                f"http://127.0.0.1:{port}",
                f"http://127.0.0.1:{admin_port}",
                running.model,
                clusters[running.model],
                running,
                envoy,
                loop,
                clusters,
                response_path,
            )
    finally:
        loop.run(running.stop(grace=1))
        loop.run(_stop_clusters(clusters, STOP_GRACE_S))
        loop.close()
