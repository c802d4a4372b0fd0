"""Type stub for the Rust extension `extproc._native` (checked against it by tests/test_native_stub.py)."""

from os import PathLike

class Gateway:
    """Served models and their endpoints, shared by every request stream."""

    def __init__(self, *, max_body_bytes: int, max_engine_message: int = ...) -> None: ...
    def add_model(
        self, name: str, model_dir: str | PathLike[str], *, max_context: int | None = None
    ) -> None: ...
    def set_endpoints(self, name: str, endpoints: list[str]) -> None: ...
    def endpoints(self, name: str) -> list[str]: ...
    def max_context(self, name: str) -> int: ...
    def set_max_context(self, name: str, tokens: int) -> None: ...
    def encode(self, name: str, text: str) -> list[int]: ...
    def new_stream(self) -> Stream: ...

class Stream:
    """One HTTP request's ext_proc stream: serialized ProcessingRequest in, ProcessingResponses out."""

    def process(self, message: bytes) -> list[bytes]: ...
    def pending_abort(self) -> tuple[str, str] | None: ...
    @property
    def done(self) -> bool: ...
    def summary(self) -> dict[str, str | int]: ...

class ExtProcServer:
    """The ext_proc gRPC server (Envoy's ExternalProcessor/Process), on its own native thread(s).

    Every stream runs through the gateway's state machine without Python; when a client goes away
    mid-generation the server sends the engine `Abort` itself.
    """

    def __init__(
        self, gateway: Gateway, listen: str, *, worker_threads: int = 1, summary_capacity: int = 4096
    ) -> None: ...
    def start(self) -> str:
        """Bind `listen` ("host:port", port 0 for any; or "unix:/path") and serve; returns the address."""
    def stop(self, grace_s: float) -> None:
        """Stop accepting, let open streams finish for up to grace_s, then end them. Blocks; idempotent."""
    @property
    def address(self) -> str | None: ...
    def stats(self) -> dict[str, int]:
        """streams_started/finished, aborts_sent/failed, summaries_dropped (since creation)."""
    def take_summaries(self) -> list[dict[str, str | int | float | bool]]:
        """Requests finished since the last call, oldest first: the stream summary, aborted, duration_s."""
