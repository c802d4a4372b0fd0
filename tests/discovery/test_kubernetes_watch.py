"""Following a Service's EndpointSlices on a fake API server: list, then watch; resume after the server
ends a watch, list again after 410, keep the last engines while the API fails."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from extproc.discovery import kubernetes
from extproc.discovery.kube_http import ApiServer, ApiUnavailable
from extproc.discovery.kubernetes import EndpointSliceWatch
from tests.discovery.fake_kube_api import DRAINING, READY, FakeKubeApi, endpoint_slice

PORTS = [("grpc", 8001)]


def vllm_slice(name: str, *endpoints: tuple[str, dict[str, bool]], service: str = "vllm") -> dict:
    return endpoint_slice(name, service, list(endpoints), PORTS)


@pytest.fixture
def api() -> FakeKubeApi:
    fake = FakeKubeApi().start()
    yield fake
    fake.stop()


class Follower:
    """A running watch and every engine set it reported."""

    def __init__(self, watch: EndpointSliceWatch, seen: list[dict[str, bool]]) -> None:
        self.watch = watch
        self.seen = seen

    @property
    def engines(self) -> dict[str, bool] | None:
        return self.seen[-1] if self.seen else None

    async def until(self, predicate: Callable[[], bool], within_s: float = 1.0) -> float:
        """Seconds until `predicate` held; fails past `within_s`."""
        start = time.monotonic()
        while not predicate():
            assert time.monotonic() - start < within_s, f"not within {within_s} s; last seen {self.engines}"
            await asyncio.sleep(0.005)
        return time.monotonic() - start


@pytest.fixture
async def follow(api: FakeKubeApi) -> AsyncIterator[Callable[..., Follower]]:
    tasks: list[asyncio.Task[None]] = []

    def start(
        service: str = "vllm", port: str | int | None = "grpc", token_file: str | None = None
    ) -> Follower:
        seen: list[dict[str, bool]] = []
        watch = EndpointSliceWatch(ApiServer(api.url, token_file), "inference", service, port, seen.append,
                                   backoff_max_s=0.2)  # fmt: skip
        tasks.append(asyncio.create_task(watch.run()))
        return Follower(watch, seen)

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_engines_added_drained_and_removed_are_reported_as_they_happen(
    api: FakeKubeApi, follow: Callable[..., Follower]
) -> None:
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY)))
    api.put(vllm_slice("other-a", ("10.9.9.9", READY), service="other"))  # another Service: not ours
    f = follow()
    await f.until(lambda: f.engines == {"10.0.0.1:8001": True})
    await f.until(lambda: api.open_watches == 1)
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY), ("10.0.0.2", READY)))
    await f.until(lambda: f.engines == {"10.0.0.1:8001": True, "10.0.0.2:8001": True}, 0.5)
    api.put(vllm_slice("vllm-b", ("10.0.1.1", READY)))
    await f.until(lambda: f.engines is not None and "10.0.1.1:8001" in f.engines, 0.5)
    api.put(vllm_slice("vllm-a", ("10.0.0.1", DRAINING), ("10.0.0.2", READY)))
    await f.until(lambda: f.engines is not None and f.engines.get("10.0.0.1:8001") is False, 0.5)
    api.delete("vllm-a")
    await f.until(lambda: f.engines == {"10.0.1.1:8001": True}, 0.5)
    assert f.watch.lists == 1 and api.lists_served() == 1


async def test_a_watch_the_server_ends_is_resumed_from_the_last_version_and_bookmarks_move_it(
    api: FakeKubeApi, follow: Callable[..., Follower]
) -> None:
    api.split_events = True  # event lines arrive in two chunks each
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY)))
    f = follow()
    await f.until(lambda: api.open_watches == 1)
    api.put(vllm_slice("other-a", ("10.9.9.9", READY), service="other"))
    api.bookmark()
    await f.until(lambda: f.watch.resource_version == "102")
    api.end_watches()
    await f.until(lambda: api.watches_started() == 2 and api.open_watches == 1)
    assert api.requests[-1] == ("watch", "102")
    api.put(vllm_slice("vllm-a", ("10.0.0.2", READY)))
    await f.until(lambda: f.engines == {"10.0.0.2:8001": True})
    assert api.lists_served() == 1


@pytest.mark.parametrize("gone_as_status", [False, True], ids=["error-event", "http-410"])
async def test_a_watch_from_an_expired_version_lists_again(
    api: FakeKubeApi, follow: Callable[..., Follower], gone_as_status: bool
) -> None:
    api.gone_as_status = gone_as_status
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY)))
    api.put(vllm_slice("vllm-b", ("10.0.0.2", READY)))
    f = follow()
    await f.until(lambda: api.open_watches == 1)
    # While the client is away, history is compacted and the set changes: only a new list can tell.
    api.fail_with(503)
    await f.until(lambda: api.open_watches == 0)
    api.delete("vllm-a")
    api.put(vllm_slice("vllm-c", ("10.0.0.3", DRAINING)))
    api.expire()
    api.fail_with(None)
    await f.until(lambda: f.engines == {"10.0.0.2:8001": True, "10.0.0.3:8001": False}, 3.0)
    assert f.watch.lists == 2
    assert ("list", None) == [r for r in api.requests if r[0] == "list"][-1]


async def test_the_last_engines_stay_while_the_api_fails_and_it_is_retried_with_backoff(
    api: FakeKubeApi, follow: Callable[..., Follower]
) -> None:
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY)))
    f = follow()
    await f.until(lambda: api.open_watches == 1)
    api.fail_with(500)
    tries = api.watches_started()
    await f.until(lambda: api.watches_started() >= tries + 3, 3.0)
    assert f.seen == [{"10.0.0.1:8001": True}]  # never emptied
    api.fail_with(None)
    api.put(vllm_slice("vllm-a", ("10.0.0.9", READY)))
    await f.until(lambda: f.engines == {"10.0.0.9:8001": True}, 3.0)


async def test_an_unreachable_api_keeps_nothing_back_and_reports_nothing(
    follow: Callable[..., Follower],
) -> None:
    seen: list[dict[str, bool]] = []
    watch = EndpointSliceWatch(ApiServer("http://127.0.0.1:9"), "ns", "vllm", None, seen.append)
    with pytest.raises(ApiUnavailable):
        await watch.api.get(kubernetes.slices_path("ns", "vllm"))
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.3)
    task.cancel()
    assert seen == []


async def test_the_token_is_read_at_every_connection(
    api: FakeKubeApi, follow: Callable[..., Follower], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    api.put(vllm_slice("vllm-a", ("10.0.0.1", READY)))
    f = follow(token_file=str(token))
    await f.until(lambda: api.open_watches == 1)
    token.write_text("rotated")
    api.end_watches()
    await f.until(lambda: api.watches_started() == 2)
    assert api.authorizations[:2] == ["Bearer first", "Bearer first"]
    assert api.authorizations[-1] == "Bearer rotated"


def test_in_cluster_the_api_and_service_account_files_are_found(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("c")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    server = ApiServer.in_cluster(env, tmp_path)
    assert server == ApiServer("https://[fd00::1]:443", str(tmp_path / "token"), str(tmp_path / "ca.crt"))
    with pytest.raises(ApiUnavailable, match="set kubernetes_api"):
        ApiServer.in_cluster({}, tmp_path)


def test_the_list_path_selects_the_service_by_its_label() -> None:
    assert kubernetes.slices_path("ns", "vllm") == (
        "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dvllm"
    )
