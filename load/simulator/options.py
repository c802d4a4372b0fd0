"""Knobs shared by every engine of a simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimOptions:
    # Time to first token: prefill and queueing, folded into one constant.
    ttft_ms: float = 5.0
    # Inter-token latency: one decode step per token.
    itl_ms: float = 2.0
    # None: the model config's max_position_embeddings (8192 when it has none).
    max_model_len: int | None = None
    # Scheduler facts GetServerInfo reports, as a default vLLM launch would.
    block_size: int = 16
    max_num_seqs: int = 256


# The defaults, shared (the options are frozen) so signatures need not call SimOptions().
DEFAULT_OPTIONS = SimOptions()
