"""The generated Envoy bootstrap: valid for the real Envoy 1.40, shaped as the gateway needs, and routing
as designed when a (fake) ext_proc server steers requests to a (fake) gRPC engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc import envoy_bootstrap as eb
from extproc.config import Settings, served_models
from extproc.stack import envoy_options, known_engines, plan_sims
from tests.tls_files import make_tls_files

REPO = Path(__file__).resolve().parents[1]


def _validate(tmp_path: Path, opts: eb.EnvoyOptions, name: str = "envoy.json") -> None:
    path = tmp_path / name
    path.write_text(eb.render_bootstrap(opts))
    eb.validate_config(path)


VARIANTS = {
    "defaults": eb.EnvoyOptions(),
    "tcp-other-ports": eb.EnvoyOptions(listen_port=18080, admin_port=19901, extproc_target="127.0.0.1:15051"),
    "unix-target": eb.EnvoyOptions(extproc_target="unix:/tmp/extproc-test.sock"),
    "unix-target-triple-slash": eb.EnvoyOptions(extproc_target="unix:///run/extproc.sock"),
    "dns-target": eb.EnvoyOptions(extproc_target="extproc.gateway.svc:50051"),
    "ipv6": eb.EnvoyOptions(listen_host="::", extproc_target="[::1]:50051"),
    "all-interfaces-access-log": eb.EnvoyOptions(listen_host="0.0.0.0", access_log=True),
    "big-bodies": eb.EnvoyOptions(max_request_bytes=64 * 1024 * 1024, stream_idle_timeout_s=7200),
    # Engines discovered at run time, served to Envoy by extproc over EDS (docs/discovery.md).
    "engines-over-eds": eb.EnvoyOptions(engines_xds="127.0.0.1:18000", engine_retries=2),
    "engines-over-eds-by-name": eb.EnvoyOptions(engines_xds="extproc.gateway.svc:18000", engine_retries=1),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_passes_envoy_validate(tmp_path: Path, name: str) -> None:
    _validate(tmp_path, VARIANTS[name])


def test_validate_reports_envoys_message(tmp_path: Path) -> None:
    config = eb.build_bootstrap(eb.EnvoyOptions())
    config["static_resources"]["clusters"][0]["no_such_field"] = 1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    with pytest.raises(eb.EnvoyConfigError, match="no_such_field"):
        eb.validate_config(path)


def test_envoy_binary_is_the_real_executable() -> None:
    path = Path(eb.envoy_binary())
    assert path.is_file()
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True).stdout
    assert "1.40." in out


def test_envoy_binary_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTPROC_ENVOY_BIN", "/opt/envoy/bin/envoy")
    assert eb.envoy_binary() == "/opt/envoy/bin/envoy"


# --- structure ---------------------------------------------------------------------------------------------


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def test_ext_proc_filter_streams_both_ways_and_fails_closed() -> None:
    filters = _hcm(eb.build_bootstrap(eb.EnvoyOptions()))["http_filters"]
    assert [f["name"] for f in filters] == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    ext_proc = filters[0]["typed_config"]
    assert ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"] == "extproc"
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["allow_mode_override"] is False
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    assert ext_proc["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb"]
    assert ext_proc["mutation_rules"]["allow_all_routing"] is True


def test_engines_cluster_takes_the_destination_header_over_h2c() -> None:
    engines = _cluster(eb.build_bootstrap(eb.EnvoyOptions()), "engines")
    assert engines["type"] == "ORIGINAL_DST"
    assert engines["lb_policy"] == "CLUSTER_PROVIDED"
    assert engines["original_dst_lb_config"] == {
        "use_http_header": True,
        "http_header_name": "x-gateway-destination-endpoint",
    }
    http = engines["typed_extension_protocol_options"][eb._H2_OPTIONS_KEY]["explicit_http_config"]
    assert "http2_protocol_options" in http


def test_extproc_cluster_addresses() -> None:
    tcp = _cluster(eb.build_bootstrap(eb.EnvoyOptions(extproc_target="127.0.0.1:7000")), "extproc")
    endpoint = tcp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert tcp["type"] == "STATIC"
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 7000}
    uds = _cluster(eb.build_bootstrap(eb.EnvoyOptions(extproc_target="unix:/run/x.sock")), "extproc")
    endpoint = uds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"] == {"pipe": {"path": "/run/x.sock"}}
    dns = _cluster(eb.build_bootstrap(eb.EnvoyOptions(extproc_target="extproc.svc:50051")), "extproc")
    assert dns["type"] == "STRICT_DNS"


def test_admin_is_on_loopback_and_listener_where_asked() -> None:
    config = eb.build_bootstrap(eb.EnvoyOptions(listen_host="0.0.0.0", listen_port=8000, admin_port=9000))
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9000}
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "0.0.0.0", "port_value": 8000}


def test_routes_engine_only_with_destination_header_else_503() -> None:
    hcm = _hcm(eb.build_bootstrap(eb.EnvoyOptions()))
    assert hcm["codec_type"] == "AUTO"
    assert hcm["generate_request_id"] is True
    # Clients' own destination and retry headers are removed before any routing.
    removed = [m["remove"] for m in hcm["early_header_mutation_extensions"][0]["typed_config"]["mutations"]]
    assert removed == [
        "x-gateway-destination-endpoint",
        "x-envoy-max-retries",
        "x-envoy-retry-on",
        "x-envoy-retry-grpc-on",
    ]
    to_engine, fallback = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert to_engine["match"]["headers"] == [
        {"name": "x-gateway-destination-endpoint", "present_match": True}
    ]
    assert to_engine["route"]["cluster"] == "engines"
    assert to_engine["route"]["timeout"] == "0s"
    assert fallback["match"] == {"prefix": "/"}
    assert fallback["direct_response"]["status"] == 503
    body = json.loads(fallback["direct_response"]["body"]["inline_string"])
    assert body["error"]["code"] == 503 and body["error"]["type"] == "service_unavailable"


@pytest.mark.parametrize("bad", ["localhost:50051:1", "nohost", "unix:relative.sock", "host:0"])
def test_bad_extproc_targets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        eb.build_bootstrap(eb.EnvoyOptions(extproc_target=bad))


def test_listen_host_must_be_an_ip() -> None:
    with pytest.raises(ValueError, match="IP address"):
        eb.build_bootstrap(eb.EnvoyOptions(listen_host="example.com"))
    assert eb.build_bootstrap(eb.EnvoyOptions(listen_host="localhost"))  # means 127.0.0.1


# --- at the edge: timeouts, limits, retries, TLS -----------------------------------------------------------


def test_engines_cluster_retries_with_a_budget_and_ejects_failing_engines() -> None:
    for opts in (eb.EnvoyOptions(), eb.EnvoyOptions(engines=("10.0.0.1:1", "10.0.0.2:1"), engine_retries=1)):
        engines = _cluster(eb.build_bootstrap(opts), "engines")
        (thresholds,) = engines["circuit_breakers"]["thresholds"]
        # Not Envoy's 3 concurrent retries per cluster: a retry every request may make at once.
        assert "max_retries" not in thresholds
        assert thresholds["retry_budget"]["budget_percent"] == {"value": 100.0}
        assert thresholds["max_requests"] >= 100_000 and thresholds["max_pending_requests"] >= 100_000
        outlier = engines["outlier_detection"]
        assert outlier["split_external_local_origin_errors"] is True
        assert outlier["consecutive_gateway_failure"] == 3
        assert outlier["enforcing_consecutive_gateway_failure"] == 100
        assert outlier["consecutive_local_origin_failure"] == 3
        assert outlier["max_ejection_percent"] == 50
    # The fallback route retries only failures before the engine answered.
    hcm = _hcm(eb.build_bootstrap(eb.EnvoyOptions(engines=("10.0.0.1:1",), engine_retries=1)))
    policy = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]
    retried = "connect-failure,refused-stream,reset,unavailable,resource-exhausted"
    assert policy["retry_on"] == retried


def test_edge_settings_reach_the_listener() -> None:
    settings = Settings(
        request_headers_timeout=5,
        request_timeout=0,
        stream_idle_timeout=900,
        client_idle_timeout=30,
        max_client_connections=1000,
    )
    config = eb.build_bootstrap(envoy_options(settings))
    hcm = _hcm(config)
    assert hcm["request_headers_timeout"] == "5s"
    assert hcm["request_timeout"] == "0s"  # off
    assert hcm["stream_idle_timeout"] == "900s"
    assert hcm["common_http_protocol_options"] == {"idle_timeout": "30s"}
    assert hcm["http2_protocol_options"]["max_concurrent_streams"] == 128
    (monitor,) = config["overload_manager"]["resource_monitors"]
    assert monitor["typed_config"]["max_active_downstream_connections"] == 1000
    defaults = _hcm(eb.build_bootstrap(envoy_options(Settings())))
    assert (defaults["request_headers_timeout"], defaults["request_timeout"]) == ("10s", "60s")


def test_the_connection_cap_stays_below_the_open_file_limit() -> None:
    assert eb.client_connection_limit(None, descriptors=1 << 20) == 50_000
    assert eb.client_connection_limit(None, descriptors=20_000) == 18_000
    assert eb.client_connection_limit(None, descriptors=1024) == 768
    assert eb.client_connection_limit(700, descriptors=1024) == 700
    with pytest.raises(ValueError, match="ulimit -n"):
        eb.client_connection_limit(1000, descriptors=1024)
    with pytest.raises(ValueError, match="too low"):
        eb.client_connection_limit(None, descriptors=200)


def test_tls_settings_must_come_in_pairs() -> None:
    with pytest.raises(ValueError, match="both tls_cert and tls_key"):
        envoy_options(Settings(tls_cert="/tls/c.pem"))
    with pytest.raises(ValueError, match="tls_client_ca needs"):
        envoy_options(Settings(tls_client_ca="/tls/ca.pem"))
    with pytest.raises(ValueError, match="needs extproc_tls_ca"):
        envoy_options(Settings(extproc_tls_cert="/tls/c.pem", extproc_tls_key="/tls/k.pem"))
    with pytest.raises(ValueError, match="both the certificate and its key"):
        eb.UpstreamTls("/tls/ca.pem", cert="/tls/c.pem")
    with pytest.raises(ValueError, match="Unix socket"):
        eb.build_bootstrap(eb.EnvoyOptions(extproc_target="unix:/x.sock", extproc_tls=eb.UpstreamTls("/ca")))


def test_tls_everywhere_passes_envoy_validate(tmp_path: Path) -> None:
    """Client TLS with client certificates, mTLS to extproc and to the engines: Envoy loads the files."""
    files = make_tls_files(tmp_path / "tls")
    client_side = eb.UpstreamTls(str(files.ca), str(files.client_cert), str(files.client_key), "localhost")
    opts = eb.EnvoyOptions(
        tls=eb.ServerTls(str(files.server_cert), str(files.server_key), client_ca=str(files.ca)),
        extproc_tls=client_side,
        engine_tls=client_side,
        engines=("10.0.0.1:50051",),
        engine_retries=0,
    )
    config = eb.build_bootstrap(opts)
    _validate(tmp_path, opts)
    listener_tls = config["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
    assert listener_tls["typed_config"]["require_client_certificate"] is True
    assert listener_tls["typed_config"]["common_tls_context"]["alpn_protocols"] == ["h2", "http/1.1"]
    for name in ("extproc", "engines"):
        upstream = _cluster(config, name)["transport_socket"]["typed_config"]
        assert upstream["sni"] == "localhost"
        assert upstream["common_tls_context"]["alpn_protocols"] == ["h2"]
        validation = upstream["common_tls_context"]["validation_context"]
        assert validation["trusted_ca"] == {"filename": str(files.ca)}


# --- the checked-in configs --------------------------------------------------------------------------------


def test_local_reference_is_what_up_runs_by_default() -> None:
    settings = Settings()
    served = tuple(
        replace(p.model, engines=p.engines) for p in plan_sims(served_models(settings), settings.sim_port)
    )
    engines, fallbacks = known_engines(served)
    assert (engines, fallbacks) == (("127.0.0.1:50100", "127.0.0.1:50101"), 1)
    # The references show the connection cap of a machine whose open-file limit does not lower it.
    cap = {"max_downstream_connections": eb.client_connection_limit(None)}
    assert replace(eb.REFERENCE_CONFIGS["local.json"], **cap) == envoy_options(settings, engines)
    assert replace(eb.REFERENCE_CONFIGS["original-dst.json"], **cap) == envoy_options(settings)
    assert eb.REFERENCE_CONFIGS["local.json"].max_downstream_connections == eb.DEFAULT_CLIENT_CONNECTIONS


@pytest.mark.parametrize("name", sorted(eb.REFERENCE_CONFIGS))
def test_checked_in_configs_are_current_and_valid(name: str) -> None:
    path = REPO / "envoy" / name
    assert path.read_text() == eb.render_bootstrap(eb.REFERENCE_CONFIGS[name]), (
        f"envoy/{name} is stale: run `make envoy-configs`"
    )
    eb.validate_config(path)


# --- real Envoy, fake extproc, fake engine -----------------------------------------------------------------

ECHO_METHOD = "/test.Echo/Echo"


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))


class FakeExtProc(ep_grpc.ExternalProcessorServicer):
    """Routes like extproc does: after the whole request body, set the destination and gRPC headers, clear
    the route cache, send the body as one gRPC frame. Paths starting /unrouted are left alone; /dead goes
    to an address where nothing listens."""

    def __init__(self, engine: str, dead: str) -> None:
        self.engine = engine
        self.dead = dead
        # What Envoy reported as the upstream of each response (the `upstream.address` attribute).
        self.upstreams: list[str] = []

    async def Process(
        self, request_iterator: AsyncIterator[ep.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ep.ProcessingResponse]:
        route: str | None = None
        body = b""
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                headers = {h.key: h.raw_value.decode() for h in req.request_headers.headers.headers}
                path = headers[":path"]
                route = self.dead if path == "/dead" else self.engine
                if path == "/fallback":
                    # The endpoint-picker list: the dead primary first, then a live fallback.
                    route = f"{self.dead},{self.engine}"
                if path.startswith("/unrouted"):
                    route = None
                if req.request_headers.end_of_stream:
                    yield ep.ProcessingResponse(request_headers=ep.HeadersResponse())
            elif kind == "request_body":
                body += req.request_body.body
                if not req.request_body.end_of_stream:
                    continue
                mutation = ep.HeaderMutation(remove_headers=["content-length"])
                if route:
                    mutation.set_headers.extend(
                        [
                            _header(":path", ECHO_METHOD),
                            _header("content-type", "application/grpc"),
                            _header("te", "trailers"),
                            _header(eb.DESTINATION_HEADER, route),
                        ]
                    )
                yield ep.ProcessingResponse(
                    request_headers=ep.HeadersResponse(
                        response=ep.CommonResponse(header_mutation=mutation, clear_route_cache=True)
                    )
                )
                framed = b"\x00" + len(body).to_bytes(4, "big") + body
                yield ep.ProcessingResponse(
                    request_body=ep.BodyResponse(
                        response=ep.CommonResponse(
                            body_mutation=ep.BodyMutation(
                                streamed_response=ep.StreamedBodyResponse(body=framed, end_of_stream=True)
                            )
                        )
                    )
                )
            elif kind == "response_headers":
                for attributes in req.attributes.values():
                    if "upstream.address" in attributes.fields:
                        self.upstreams.append(attributes.fields["upstream.address"].string_value)
                yield ep.ProcessingResponse(response_headers=ep.HeadersResponse())
            elif kind == "response_body":
                chunk = req.response_body
                yield ep.ProcessingResponse(
                    response_body=ep.BodyResponse(
                        response=ep.CommonResponse(
                            body_mutation=ep.BodyMutation(
                                streamed_response=ep.StreamedBodyResponse(
                                    body=chunk.body, end_of_stream=chunk.end_of_stream
                                )
                            )
                        )
                    )
                )
            elif kind == "request_trailers":
                yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
            elif kind == "response_trailers":
                yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


def _echo_handler() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"echo:" + request

    return grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )


@pytest.fixture
def envoy_process(tmp_path: Path, free_ports: Any) -> Iterator[eb.EnvoyOptions]:
    opts = eb.EnvoyOptions(
        listen_port=free_ports.one(),
        admin_port=free_ports.one(),
        extproc_target=f"127.0.0.1:{free_ports.one()}",
    )
    with _run_envoy(tmp_path, opts):
        yield opts


@contextlib.contextmanager
def _run_envoy(tmp_path: Path, opts: eb.EnvoyOptions) -> Iterator[None]:
    """Envoy on `opts`, ready, until the block ends however it ends (then terminated; killed after 10 s)."""
    path = tmp_path / "envoy.json"
    path.write_text(eb.render_bootstrap(opts))
    with open(tmp_path / "envoy.log", "wb") as log:
        proc = subprocess.Popen(
            [eb.envoy_binary(), "-c", str(path), "--disable-hot-restart", "--log-level", "warning"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{opts.admin_port}/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, (tmp_path / "envoy.log").read_text()
                assert time.monotonic() < deadline, "Envoy did not become ready"
                time.sleep(0.1)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _post(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


async def test_envoy_routes_through_ext_proc_to_an_h2c_engine(
    envoy_process: eb.EnvoyOptions, free_ports: Any
) -> None:
    opts = envoy_process
    port = opts.listen_port
    # extproc not running yet: fail closed, with an OpenAI-style error.
    status, headers, body = await asyncio.to_thread(_post, port, "/v1/chat/completions", b"hi")
    assert (status, headers["content-type"]) == (503, "application/json")
    assert json.loads(body)["error"]["type"] == "service_unavailable"

    engine_port = free_ports.one()
    engine = grpc.aio.server()
    engine.add_generic_rpc_handlers([_echo_handler()])
    engine.add_insecure_port(f"127.0.0.1:{engine_port}")
    ext_proc = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(
        FakeExtProc(f"127.0.0.1:{engine_port}", dead=f"127.0.0.1:{free_ports.one()}"), ext_proc
    )
    ext_proc.add_insecure_port(opts.extproc_target)
    await engine.start()
    await ext_proc.start()
    try:
        # Routed: the body reaches the engine as a gRPC call over h2c and the reply comes back.
        status, headers, body = await asyncio.to_thread(_post, port, "/v1/chat/completions", b"hi")
        assert status == 200, body
        assert body == b"\x00\x00\x00\x00\x07echo:hi"
        assert headers.get("x-request-id")

        # Not routed by ext_proc: the OpenAI-style 503, never a loop back into the listener.
        status, headers, body = await asyncio.to_thread(_post, port, "/unrouted", b"x")
        assert status == 503
        assert headers["content-type"] == "application/json"
        assert json.loads(body) == eb.NO_ENGINE_BODY

        # The engine extproc picked is down: Envoy's 503, as OpenAI JSON.
        status, headers, body = await asyncio.to_thread(_post, port, "/dead", b"x")
        assert (status, headers["content-type"]) == (503, "application/json"), body
        assert json.loads(body)["error"]["message"] == "the selected engine is unavailable"

        # A client cannot pick the engine itself.
        sneaky = {eb.DESTINATION_HEADER: f"127.0.0.1:{engine_port}"}
        status, _, body = await asyncio.to_thread(_post, port, "/unrouted", b"x", sneaky)
        assert (status, json.loads(body)) == (503, eb.NO_ENGINE_BODY), body
    finally:
        await ext_proc.stop(0)
        await engine.stop(0)


async def test_known_engines_follow_the_fallback_list(tmp_path: Path, free_ports: Any) -> None:
    """Engines listed in the bootstrap: a request whose primary is down is retried on the next address
    extproc listed, and extproc learns which engine answered (the `upstream.address` attribute)."""
    live, dead = f"127.0.0.1:{free_ports.one()}", f"127.0.0.1:{free_ports.one()}"
    opts = eb.EnvoyOptions(
        listen_port=free_ports.one(),
        admin_port=free_ports.one(),
        extproc_target=f"127.0.0.1:{free_ports.one()}",
        engines=(dead, live),
        engine_retries=1,
    )
    engine = grpc.aio.server()
    engine.add_generic_rpc_handlers([_echo_handler()])
    engine.add_insecure_port(live)
    fake = FakeExtProc(live, dead=dead)
    ext_proc = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(fake, ext_proc)
    ext_proc.add_insecure_port(opts.extproc_target)
    await engine.start()
    await ext_proc.start()
    try:
        with _run_envoy(tmp_path, opts):
            status, _, body = await asyncio.to_thread(_post, opts.listen_port, "/fallback", b"hi")
            assert (status, body) == (200, b"\x00\x00\x00\x00\x07echo:hi")
            assert fake.upstreams == [live]
            # Only the dead engine listed: once the list is spent, the retry goes to another engine of the
            # cluster (round robin), so `extproc up` uses this mode for a single model only.
            status, _, body = await asyncio.to_thread(_post, opts.listen_port, "/dead", b"x")
            assert (status, body) == (200, b"\x00\x00\x00\x00\x06echo:x")
            assert fake.upstreams == [live, live]
    finally:
        await ext_proc.stop(0)
        await engine.stop(0)


def test_known_engines_must_be_ip_addresses() -> None:
    with pytest.raises(ValueError, match="IP addresses"):
        eb.build_bootstrap(eb.EnvoyOptions(engines=("engine-0.svc:50051",)))


def test_the_response_module_config_passes_envoy_validate(tmp_path: Path) -> None:
    settings = Settings(response_path="module")
    module = eb.response_module(settings)
    assert module is not None and module.path.endswith("libextproc_envoy.so")
    assert module.models == tuple((m.name, str(m.model_dir)) for m in served_models(settings))
    _validate(tmp_path, eb.EnvoyOptions(response_module=module))
    hcm = eb.build_bootstrap(eb.EnvoyOptions(response_module=module))["static_resources"]["listeners"][0]
    filters = hcm["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    names = [f["name"] for f in filters]
    assert names == [
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.dynamic_modules",
        "envoy.filters.http.router",
    ]
    mode = filters[0]["typed_config"]["processing_mode"]
    assert (mode["response_header_mode"], mode["response_body_mode"], mode["response_trailer_mode"]) == (
        "SEND",
        "NONE",
        "SEND",
    )
    assert eb.response_module(Settings()) is None
