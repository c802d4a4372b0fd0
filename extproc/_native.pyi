"""Type stub for the Rust extension `extproc._native` (checked against it by tests/test_native_stub.py)."""

from collections.abc import Callable
from os import PathLike
from typing import Any

# Header and metadata names shared with Envoy's configuration (native/core/src/contracts.rs).
DESTINATION_HEADER: str
LB_METADATA_NAMESPACE: str
SERVED_ENDPOINT_KEY: str
SUBSET_HINT_NAMESPACE: str
SUBSET_HINT_KEY: str
UPSTREAM_ADDRESS_ATTRIBUTE: str
MAX_RETRIES_HEADER: str
CLIENT_HEADERS_REMOVED: tuple[str, ...]
OBJECTIVE_HEADER: str
SESSION_HEADER: str
REQUEST_ID_HEADER: str
AUTHORIZATION_HEADER: str
ENGINE_REQUEST_HEADERS: tuple[str, ...]
# The response path inside Envoy: the plan extproc leaves in dynamic metadata, the outcome trailer the
# module returns, and the ext_proc metadata by which a module config tells extproc the module answers.
RESPONSE_PLAN_NAMESPACE: str
RESPONSE_PLAN_KEY: str
OUTCOME_TRAILER: str
RESPONSE_PATH_METADATA: str
RESPONSE_PATH_MODULE: str
# The routing policy registry's names, the default first (native/core/src/routing/policy/registry.rs).
ROUTING_POLICIES: tuple[str, ...]
DEFAULT_ROUTING_POLICY: str

class EngineLoad:
    """An engine's own load report: one data-parallel rank's, or summed over its ranks."""

    def __init__(
        self,
        *,
        running: int,
        waiting: int,
        kv_usage: float,
        max_running: int,
        waiting_uncached_tokens: int = 0,
    ) -> None: ...
    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float:
        """KV-cache usage in [0, 1] (clamped on construction; NaN reads 0)."""
    @property
    def max_running(self) -> int:
        """The engine's admission window; 0 when unknown."""
    @property
    def waiting_uncached_tokens(self) -> int:
        """Prompt tokens of waiting requests not served from the prefix cache (queued prefill work)."""

class Gateway:
    """Served models and their endpoints, shared by every request stream."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        max_engine_message: int = ...,
        destination_fallbacks: int = ...,
        max_buffered_output_tokens: int = ...,
        first_token_timeout: float = ...,
        inter_token_timeout: float = ...,
        response_in_envoy: bool = ...,
        responses_mcp_max_rounds: int = ...,
    ) -> None: ...
    def add_model(
        self,
        name: str,
        model_dir: str | PathLike[str],
        *,
        max_context: int | None = None,
        policy: str = "kv_events",
        routing_config: str | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> None: ...
    def set_endpoints(
        self,
        name: str,
        endpoints: list[tuple[str, int] | tuple[str, int, str] | tuple[str, int, str, int]],
    ) -> None: ...
    def set_health(self, name: str, address: str, healthy: bool) -> bool: ...
    def set_tracing(self, enabled: bool) -> None:
        """Give every request from now on a trace context (summaries then carry `trace`)."""
    def report_load(
        self, name: str, address: str, load: EngineLoad, *, dp_rank: int | None = None
    ) -> bool: ...
    def endpoint_protocols(self, name: str) -> list[tuple[str, str]]: ...
    def endpoints(self, name: str) -> list[str]: ...
    def apply_kv_events(self, name: str, address: str, batch: bytes) -> str: ...
    def apply_zmq_kv_events(self, name: str, address: str, sequence: int, payload: bytes) -> str: ...
    def reset_kv_events(self, name: str, address: str) -> bool: ...
    def routing_stats(self, name: str) -> tuple[str, str]: ...
    def set_api_keys(self, keys: list[tuple[str, str, list[str], int]] | None) -> None: ...
    def metrics_text(self) -> str:
        """The data plane's metrics in the Prometheus text format: the whole text of one scrape."""
    def engines(self) -> list[dict[str, str | int | float | bool]]:
        """Every model's engine endpoints: model, engine, protocol, healthy, in_flight_requests,
        in_flight_tokens, running, waiting, kv_usage, cached_blocks, penalty, penalty_failures."""
    def model_names(self) -> list[str]: ...
    def max_context(self, name: str) -> int: ...
    def set_max_context(self, name: str, tokens: int) -> None: ...
    def encode(self, name: str, text: str) -> list[int]: ...
    def new_stream(self) -> Stream: ...

class Stream:
    """One HTTP request's ext_proc stream: serialized ProcessingRequest in, ProcessingResponses out."""

    def process(self, message: bytes) -> list[bytes]:
        """A serialized ProcessingRequest in (ValueError if not one); serialized ProcessingResponses out."""
    def pending_abort(self) -> tuple[str, str, str] | None: ...
    @property
    def done(self) -> bool: ...
    def summary(self) -> dict[str, str | int]: ...

class ExtProcServer:
    """The ext_proc gRPC server (Envoy's ExternalProcessor/Process), on its own native thread(s).

    Every stream runs through the gateway's state machine without Python; when a client goes away
    mid-generation the server sends the engine `Abort` itself.
    """

    def __init__(
        self,
        gateway: Gateway,
        listen: str,
        *,
        worker_threads: int = 1,
        request_workers: int = 0,
        summary_capacity: int = 4096,
        tls_cert: str | PathLike[str] | None = None,
        tls_key: str | PathLike[str] | None = None,
        tls_client_ca: str | PathLike[str] | None = None,
        engine_tls_ca: str | PathLike[str] | None = None,
        engine_tls_cert: str | PathLike[str] | None = None,
        engine_tls_key: str | PathLike[str] | None = None,
        engine_tls_server_name: str | None = None,
        responses_store: str = "memory",
        module_stop_file: str | PathLike[str] | None = None,
    ) -> None:
        """`tls_cert`/`tls_key`: the port over TLS (`tls_client_ca`: mutual TLS). `engine_tls_*`: the
        server's own engine calls (Abort, batched completions) over TLS. `module_stop_file`: created when a
        stop's grace ran out, so that Envoy's response module ends its answers too. ValueError on a bad
        combination; unreadable files raise OSError at `start`."""
    def start(self) -> str:
        """Bind `listen` ("host:port", port 0 for any; or "unix:/path") and serve; returns the address."""
    def stop(self, grace_s: float) -> None:
        """Stop accepting, let open streams finish for up to grace_s, then end them. Blocks; idempotent."""
    @property
    def address(self) -> str | None: ...
    def stats(self) -> dict[str, int]:
        """streams_started/finished, aborts_sent/failed, summaries_dropped (since creation)."""
    def take_summaries(self) -> list[dict[str, Any]]:
        """Requests finished since the last call, oldest first: the stream summary, aborted, duration_s,
        timings_ns (phase -> ns since the epoch) and, with tracing on, trace (hex ids, sampled)."""

class KvSubscription:
    """One engine's SubscribeKvEvents stream, read on a native thread into the router of `model`: every
    batch is applied as `Gateway.apply_kv_events` would, without Python. Cancelled by `cancel()` or when
    collected."""

    def __init__(
        self,
        gateway: Gateway,
        model: str,
        address: str,
        on_end: Callable[[str], None],
        *,
        method: str = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents",
        tls_ca: str | PathLike[str] | None = None,
        tls_cert: str | PathLike[str] | None = None,
        tls_key: str | PathLike[str] | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        """Subscribes from sequence 0 (load records first). `on_end(reason)` is called once, from a native
        thread, when the subscription ends by itself: "gap", "malformed" or "unknown_endpoint" (the
        router needs a resync), "stream ended", or a gRPC status code name ("UNAVAILABLE",
        "UNIMPLEMENTED", ...). `tls_*`: the engine over TLS. ValueError for an unknown model, a bad address
        or method, or TLS settings without `tls_ca`; OSError for an unreadable TLS file."""
    @property
    def batches(self) -> int:
        """Batches received so far."""
    @property
    def running(self) -> bool:
        """Still reading: neither ended nor cancelled."""
    def cancel(self) -> None:
        """Stops reading and drops the stream; `on_end` is not called. Idempotent."""

class Tokenizer:
    """The native tokenizer, chat templates and detokenizer of one model (tests and benchmarks)."""

    @staticmethod
    def from_model_dir(model_dir: str | PathLike[str]) -> Tokenizer: ...
    @staticmethod
    def from_file(path: str | PathLike[str]) -> Tokenizer: ...
    @staticmethod
    def from_tiktoken(
        path: str | PathLike[str],
        pattern: str | None = None,
        special_tokens: list[tuple[str, int]] | None = None,
    ) -> Tokenizer: ...
    @property
    def fast_path_refusal(self) -> str | None: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    def token_to_id(self, token: str) -> int | None: ...
    def id_to_token(self, id: int) -> str | None: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_uncached(self, text: str) -> list[int]: ...
    def count_tokens(self, text: str, *, cached: bool = True) -> int: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...
    def decode_stream(
        self,
        ids: list[int],
        chunk_sizes: list[int],
        skip_special_tokens: bool = False,
        stop: list[str] | None = None,
    ) -> list[str]: ...
    def render_chat(
        self,
        messages_json: str,
        *,
        tools_json: str | None = None,
        documents_json: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str | None = None,
        chat_template_kwargs_json: str | None = None,
        template_name: str | None = None,
    ) -> str: ...
    def chat_ids(
        self,
        messages_json: str,
        *,
        tools_json: str | None = None,
        documents_json: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str | None = None,
        chat_template_kwargs_json: str | None = None,
        template_name: str | None = None,
    ) -> list[int]: ...
    def chat_prompt_len(self, messages_json: str, *, add_generation_prompt: bool = True) -> int: ...
    def cache_stats(self) -> dict[str, int]: ...
    def clear_cache(self) -> None: ...
    def set_cache_limits(self, max_entries: int, max_bytes: int) -> None: ...

class ChatTemplate:
    """A chat template compiled on its own (HF semantics), for tests."""

    def __init__(self, source: str) -> None: ...
    def render(self, context_json: str) -> str: ...
    def apply(
        self,
        messages_json: str,
        *,
        tools_json: str | None = None,
        documents_json: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str | None = None,
        chat_template_kwargs_json: str | None = None,
        special_tokens_json: str | None = None,
    ) -> str: ...
