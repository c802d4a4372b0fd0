"""Where each request went, and which engines held its prompt then: one JSON line per Generate.

A router's hit rate says how much it found cached, not how much it could have found. This log records,
at the moment a request reaches its engine, how many leading blocks of its prompt every engine of the
cluster had cached and how busy each was, so a benchmark can tell a prefix routed away from an idle
holder (a routing miss) from one routed away from a busy holder (a trade) or one nobody held. The
simulator writes it only when asked (`--request-log`): it looks into every engine's cache per request.

A line: `{"t": wall time s, "engine": i, "rank": r, "id": request id, "prompt": tokens, "block": block
size, "held": [blocks cached per engine], "waiting": [...], "running": [...], "prefill": [...]}`; per
engine, its DP ranks summed (held: the best rank). `prefill` is the prompt work the engine has left
before this request: tokens of queued prompts past their cached prefix, and of running prompts not yet
computed (a long prefill in progress is running, not waiting).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from extproc.simulator.core import EngineCore
    from extproc.simulator.scheduler import Scheduler, Sequence


class RequestLog:
    def __init__(self, path: Path, cores: list[EngineCore]) -> None:
        self._cores = cores
        self._out: IO[str] = path.open("w", buffering=1 << 16)

    def observe(self, core: EngineCore, rank: int, request_id: str, sequence: Sequence) -> None:
        """A request admitted on `core`'s rank `rank`, before it is queued (its own wait not counted)."""
        size = core.options.block_size
        hashes = sequence.chain_hashes(core.schedulers[rank].cache)
        # The scheduler never reuses the block holding the prompt's last token: it must be computed.
        usable = (len(sequence.tokens) - 1) // size
        held, waiting, running, prefill = [], [], [], []
        for other in self._cores:
            held.append(min(max(s.cache.longest_hit(hashes) for s in other.schedulers), usable))
            waiting.append(sum(len(s.waiting) for s in other.schedulers))
            running.append(sum(len(s.running) for s in other.schedulers))
            prefill.append(sum(_prefill_left(s) for s in other.schedulers))
        line = {
            "t": time.time(),
            "engine": self._cores.index(core),
            "rank": rank,
            "id": request_id,
            "prompt": len(sequence.tokens),
            "block": size,
            "held": held,
            "waiting": waiting,
            "running": running,
            "prefill": prefill,
        }
        self._out.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._out.close()


def _prefill_left(scheduler: Scheduler) -> int:
    """Prompt tokens the scheduler has yet to compute: running prompts' rest, queued ones past their hit."""
    running = sum(max(s.prompt_len - s.num_computed, 0) for s in scheduler.running)
    return running + scheduler.waiting_uncached_tokens
