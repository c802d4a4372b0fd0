"""Engine discovery through a real stack (Envoy, the native extproc, simulated engines): engines of a
Kubernetes Service, served by a fake API server, and of a DNS name, are added, drained and removed while
serving, and routing follows within a second; Envoy reaches every discovered address through its
ORIGINAL_DST engines cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from extproc import server, status
from extproc.config import Settings, served_models
from extproc.discovery.dns import Resolver, resolve_addresses
from extproc.envoy_bootstrap import build_bootstrap
from extproc.metrics import engine_view
from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.cluster import SimEngine
from extproc.stack import envoy_options, known_engines
from tests.conftest import FreePorts
from tests.discovery.fake_kube_api import DRAINING, READY, FakeKubeApi, endpoint_slice
from tests.integration.harness import LoopThread, envoy_running

SERVICE = "k8s://inference/vllm:grpc"
ROUTING_WITHIN_S = 1.0


async def _stop(clusters: list[SimCluster]) -> None:
    await asyncio.gather(*(c.stop(0) for c in clusters))


@dataclass
class DiscoveryStack:
    base_url: str
    admin_url: str
    model: str
    engines: list[SimEngine]
    gateway: server.Running
    loop: LoopThread

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=20)

    def chat(self, text: str, max_tokens: int = 4) -> None:
        reply = self.client().chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
        )
        assert reply.choices[0].finish_reason in ("stop", "length")

    def served_by(self, requests: int) -> list[int]:
        """Send `requests` chats; how many each engine took."""
        before = [e.stats.generate_requests for e in self.engines]
        for i in range(requests):
            self.chat(f"question {i}")
        return [e.stats.generate_requests - b for e, b in zip(self.engines, before, strict=True)]

    def routable(self) -> set[str]:
        """The engines the router may pick now."""
        return set(self.gateway.gateway.endpoints(self.model))

    def known(self) -> set[str]:
        """Every engine the router knows, ready or draining."""
        return {str(e["engine"]) for e in self.gateway.gateway.engines() if e["model"] == self.model}

    def envoy_engines(self) -> set[str]:
        """The hosts of Envoy's engines cluster (admin /clusters)."""
        with urllib.request.urlopen(f"{self.admin_url}/clusters", timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        return {
            line.split("::")[1] for line in lines if line.startswith("engines::") and "::cx_active::" in line
        }

    def within(self, predicate: Callable[[], bool], seconds: float = ROUTING_WITHIN_S) -> float:
        """Seconds until `predicate` held; fails past `seconds`."""
        start = time.monotonic()
        while not predicate():
            assert time.monotonic() - start < seconds, f"not within {seconds} s: routable {self.routable()}"
            time.sleep(0.005)
        return time.monotonic() - start


@contextlib.contextmanager
def discovery_stack(
    tmp: Path,
    engine_hosts: Sequence[str],
    engines: tuple[str, ...],
    *,
    same_port: int = 0,
    resolve: Resolver = resolve_addresses,
    sim: SimOptions | None = None,
    before_start: Callable[[list[SimEngine]], None] = lambda engines: None,
    eds_fallbacks: int | None = None,
    **settings: Any,
) -> Iterator[DiscoveryStack]:
    """Simulated engines on `engine_hosts` (one each; `same_port`: all on that port), extproc told only
    `engines` (discovery sources), Envoy configured as `extproc up` would for them. `before_start` gets
    the engines once they run, before extproc starts (to publish them). `eds_fallbacks`: extproc serves
    Envoy's engines cluster over EDS and lists that many fallbacks, which Envoy follows."""
    ports = FreePorts()
    loop = LoopThread()
    port = same_port

    async def start() -> list[SimCluster]:
        return [
            await start_engines(
                default_model_dir(), count=1, base_port=port, host=host, options=sim or SimOptions()
            )
            for host in engine_hosts
        ]

    clusters = loop.run(start())
    before_start([c.engines[0] for c in clusters])
    if eds_fallbacks is not None:
        settings.update(xds_listen="127.0.0.1:0", destination_fallbacks=eds_fallbacks)
    config = Settings(listen="127.0.0.1:0", engines=engines, routing_policy="round_robin", **settings)
    # What `up` and `envoy-config` give Envoy for discovered engines: no static list.
    assert known_engines(served_models(config))[0] == ()
    try:
        running = loop.run(server.start(config, engine_wait_s=10, resolve=resolve))
    except BaseException:
        loop.run(_stop(clusters))
        loop.close()
        raise
    listen, admin = ports.one(), ports.one()
    envoy_settings = Settings(
        port=listen, admin_port=admin, listen=running.address, xds_listen=running.eds_address
    )
    bootstrap = build_bootstrap(envoy_options(envoy_settings, (), eds_fallbacks))
    engines_cluster = bootstrap["static_resources"]["clusters"][1]
    assert engines_cluster["type"] == ("ORIGINAL_DST" if eds_fallbacks is None else "EDS")
    (tmp / "envoy.json").write_text(json.dumps(bootstrap))
    try:
        with envoy_running(tmp / "envoy.json", admin):
            yield DiscoveryStack(
                f"http://127.0.0.1:{listen}",
                f"http://127.0.0.1:{admin}",
                running.model,
                [c.engines[0] for c in clusters],
                running,
                loop,
            )
    finally:
        loop.run(running.stop(grace=1))
        loop.run(_stop(clusters))
        loop.close()


def slice_of(engine: SimEngine, conditions: dict[str, bool], name: str | None = None) -> dict[str, Any]:
    """A slice listing one simulated engine (each engine has its own port, so its own slice)."""
    host, port = engine.address.rsplit(":", 1)
    return endpoint_slice(name or f"vllm-{port}", "vllm", [(host, conditions)], [("grpc", int(port))])


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi().start()
    yield fake
    fake.stop()


def slice_name(engine: SimEngine) -> str:
    return f"vllm-{engine.address.rsplit(':', 1)[1]}"


def test_service_engines_added_drained_and_removed_are_routed_within_a_second(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    slow = SimOptions(itl_ms=20.0)  # a 100-token stream lasts 2 s: long enough to drain under
    hosts = ["127.0.0.1"] * 3

    def first_engine_only(engines: list[SimEngine]) -> None:
        api.put(slice_of(engines[0], READY))

    with discovery_stack(
        tmp_path, hosts, (SERVICE,), sim=slow, before_start=first_engine_only, kubernetes_api=api.url
    ) as s:
        e0, e1, e2 = s.engines
        assert s.routable() == {e0.address}
        assert s.served_by(4) == [4, 0, 0]

        # Added: probed, then routed, within a second; requests then reach it.
        api.put(slice_of(e1, READY))
        s.within(lambda: s.routable() == {e0.address, e1.address})
        assert s.served_by(4) == [2, 2, 0]

        # Draining (terminating): no new requests at once, while its open stream runs to its end.
        before = e1.stats.generate_requests
        stream = s.client().chat.completions.create(
            model=s.model,
            messages=[{"role": "user", "content": "long"}],
            max_tokens=100,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)  # the stream is open on one of the two
        draining, other = (e1, e0) if e1.stats.generate_requests > before else (e0, e1)
        api.put(slice_of(draining, DRAINING))
        s.within(lambda: s.routable() == {other.address})
        assert draining.address in s.known(), "a draining engine stays known until it is gone"
        view = {e["engine"]: e for e in engine_view(s.gateway.gateway, s.gateway.pools)["engines"]}
        assert (view[draining.address]["draining"], view[other.address]["draining"]) == (True, False)
        rows = [line.split() for line in status.table(list(view.values())).splitlines()[1:]]
        assert [row[3] for row in rows if row[:2] == [s.model, draining.address]] == ["draining"]
        served = s.served_by(4)
        assert served[s.engines.index(draining)] == 0 and served[s.engines.index(other)] == 4
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"], "the stream open on the draining engine ran to its end"

        # Removed: the router forgets it within a second; a new engine joins; requests go to the rest.
        api.delete(slice_name(draining))
        s.within(lambda: draining.address not in s.known())
        api.put(slice_of(e2, READY))
        s.within(lambda: s.routable() == {other.address, e2.address})
        served = s.served_by(4)
        assert served[s.engines.index(draining)] == 0
        assert served[s.engines.index(other)] == 2 and served[2] == 2


def test_after_a_410_the_service_is_listed_again_and_routing_catches_up(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    def both(engines: list[SimEngine]) -> None:
        for engine in engines:
            api.put(slice_of(engine, READY))

    with discovery_stack(
        tmp_path, ["127.0.0.1"] * 2, (SERVICE,), before_start=both, kubernetes_api=api.url
    ) as s:
        e0, e1 = s.engines
        s.within(lambda: s.routable() == {e0.address, e1.address})
        # The API goes away; meanwhile engine 0 leaves and the history is compacted past the client's
        # version: its watch resumes into a 410 and only a new list shows the change.
        api.fail_with(503)
        s.within(lambda: api.open_watches == 0)
        api.delete(slice_name(e0))
        api.expire()
        assert s.routable() == {e0.address, e1.address}, "the last known engines stay while the API fails"
        lists = api.lists_served()
        api.fail_with(None)
        s.within(lambda: s.routable() == {e1.address}, 5.0)  # the watch's backoff, then the list
        assert api.lists_served() == lists + 1
        assert s.served_by(3) == [0, 3]


def test_dns_engines_follow_the_names_addresses(tmp_path: Path) -> None:
    """Two engines on one port at two loopback addresses, behind one name whose answer changes."""
    answer = ["127.0.0.1"]
    port = FreePorts().one()

    async def resolve(name: str, port_asked: int) -> list[str]:
        assert (name, port_asked) == ("engines.test", port)
        return list(answer)

    hosts = ["127.0.0.1", "127.0.0.2"]
    with discovery_stack(
        tmp_path,
        hosts,
        (f"grpc://engines.test:{port}",),
        same_port=port,
        resolve=resolve,
        dns_refresh_interval=0.1,
    ) as s:
        e1, e2 = s.engines
        assert s.routable() == {e1.address}
        assert s.served_by(2) == [2, 0]
        answer.append("127.0.0.2")
        s.within(lambda: s.routable() == {e1.address, e2.address})
        assert s.served_by(4) == [2, 2], "Envoy reaches the second address by the header alone"
        answer.remove("127.0.0.1")
        s.within(lambda: s.known() == {e2.address})
        assert s.served_by(2) == [0, 2]


def test_over_eds_envoy_knows_the_discovered_engines_and_follows_fallbacks(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    def two(engines: list[SimEngine]) -> None:
        for engine in engines[:2]:
            api.put(slice_of(engine, READY))

    hosts = ["127.0.0.1"] * 3
    slow = SimOptions(itl_ms=20.0)
    with discovery_stack(
        tmp_path, hosts, (SERVICE,), sim=slow, before_start=two, eds_fallbacks=1, kubernetes_api=api.url
    ) as s:
        e0, e1, e2 = s.engines
        s.within(lambda: s.envoy_engines() == {e0.address, e1.address}, 5.0)
        # An engine Envoy learns over EDS as soon as the Service lists it (before it is routed to) and
        # forgets when the Service drops it.
        api.put(slice_of(e2, READY))
        s.within(lambda: s.envoy_engines() == {e0.address, e1.address, e2.address})
        s.within(lambda: e2.address in s.routable())
        assert s.served_by(3) == [1, 1, 1]
        # A stream open on an engine EDS then removes runs to its end (Envoy drains the host).
        streams = []
        while e2.stats.generate_requests < 2:
            stream = iter(
                s.client().chat.completions.create(
                    model=s.model,
                    messages=[{"role": "user", "content": "long"}],
                    max_tokens=100,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
            )
            next(stream)
            streams.append(stream)
        api.delete(slice_name(e2))
        s.within(lambda: s.envoy_engines() == {e0.address, e1.address})
        for stream in streams:
            finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
            assert finish == ["length"]
        # One engine refuses every request: Envoy follows extproc's fallback to the other.
        e0.faults.set(fail_code="UNAVAILABLE", fail_message="refusing")
        removed_calls = e2.stats.generate_requests
        for i in range(4):
            s.chat(f"after the refusal {i}")
        assert e0.stats.faults >= 1, "the refusing engine was picked"
        assert e1.stats.completed >= 4 and e2.stats.generate_requests == removed_calls
