"""Knobs shared by every engine of a simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass

from extproc.simulator.script import ScriptRule, parse_rules

ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class SimOptions:
    """Timing, capacity and scheduler facts of a simulated engine.

    Time model (one scheduler step at a time, as vLLM runs them): a step that carries prefill work lasts
    `ttft_ms + prefill_ms_per_token * uncached prompt tokens in the step`, a decode-only step lasts
    `itl_ms`; either grows by `decode_ms_per_seq` per decoding sequence in the batch. So a lone short
    request sees time to first token ≈ ttft_ms and inter-token latency ≈ itl_ms, a cached prompt skips
    its prefill cost, and a full batch decodes slower. Every duration is multiplied by `time_scale`.
    """

    # Fixed cost of a step that runs prefill work (the first token of a short prompt on an idle engine).
    ttft_ms: float = 5.0
    # Fixed cost of a decode-only step (one token for every running sequence).
    itl_ms: float = 2.0
    # Prefill cost per prompt token not served from the prefix cache.
    prefill_ms_per_token: float = 0.02
    # Extra step cost per decoding sequence in the batch.
    decode_ms_per_seq: float = 0.02
    # Multiplies every duration: 0.1 runs ten times faster than the coefficients say.
    time_scale: float = 1.0
    # Streamed tokens per Generate message: 1 sends a chunk per step; N holds a choice's tokens until N
    # are out (or it ends), as an engine that merges deltas for a reader that lags (benchmarks' chunking).
    tokens_per_message: int = 1
    # None: the model config's max_position_embeddings (8192 when it has none).
    max_model_len: int | None = None
    # KV cache: tokens per block and capacity in blocks (vLLM's GPU default block size is 16; its CPU
    # backend uses 128, which the contract suite configures to match the real engine).
    block_size: int = 16
    num_blocks: int = 4096
    # Scheduler: the running window and the token budget of one step (chunked prefill beyond it).
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # Data-parallel ranks behind the engine's one address, each with its own scheduler and KV cache
    # (`num_blocks` and the scheduler limits are per rank, as each vLLM DP rank has its own).
    data_parallel_size: int = 1
    # What GetServerInfo/GetLoads report as the engine's version.
    version: str = "0.32.0"
    # vLLM's ZMQ KV-event channel (zmq_publisher.py; needs pyzmq and msgpack), off when None. Engine i
    # publishes on the endpoint with "{i}" replaced by i, or with a tcp port raised by i; a replay ROUTER
    # on the second endpoint (same rule) when given; messages carry the topic as their first frame.
    kv_events_zmq: str | None = None
    kv_events_zmq_replay: str | None = None
    kv_events_zmq_topic: str = ""
    # Tests' engine spy: keep the request id and gRPC metadata of the last this-many Generate calls
    # (`EngineCore.recorded`); 0 records nothing.
    record_calls: int = 0
    # Scripted outputs (script.py): rules {match, text, model, count}, the first that matches a prompt
    # gives the answer's text; a list of rules or their dicts is accepted and kept as a tuple.
    script: tuple[ScriptRule, ...] = ()
    # Serve gRPC over TLS with this PEM certificate chain and key; with tls_client_ca, clients must present
    # a certificate it signed (mutual TLS). None: plaintext.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.script, tuple) or not all(isinstance(r, ScriptRule) for r in self.script):
            object.__setattr__(self, "script", parse_rules(self.script))
        for name in ("ttft_ms", "itl_ms", "prefill_ms_per_token", "decode_ms_per_seq", "time_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.record_calls < 0:
            raise ValueError("record_calls must not be negative")
        for name in (
            "block_size",
            "num_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "tokens_per_message",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.data_parallel_size < 1:
            raise ValueError("data_parallel_size must be at least 1")
        for name in ("kv_events_zmq", "kv_events_zmq_replay"):
            endpoint = getattr(self, name)
            if endpoint is not None and not endpoint.startswith(ZMQ_SCHEMES):
                raise ValueError(f"{name} must start with one of {', '.join(ZMQ_SCHEMES)}: {endpoint!r}")
        if self.kv_events_zmq_replay is not None and self.kv_events_zmq is None:
            raise ValueError("kv_events_zmq_replay needs kv_events_zmq")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")


# What `EngineCore.retime` (HTTP POST /timing) may change while engines run.
TIMING_FIELDS = (
    "ttft_ms",
    "itl_ms",
    "prefill_ms_per_token",
    "decode_ms_per_seq",
    "time_scale",
    "tokens_per_message",
)


# The defaults, shared (the options are frozen) so signatures need not call SimOptions().
DEFAULT_OPTIONS = SimOptions()
