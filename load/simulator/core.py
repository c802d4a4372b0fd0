"""What one simulated engine is, whatever protocol it speaks: model facts, scheduler, KV cache, events,
load figures, counters and faults. The protocol servicers (`engine.VllmEngine`, `sglang.SglangEngine`)
translate their messages to and from this.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from smg_grpc_proto.generated import common_pb2

from load.simulator.faults import FaultPlan
from load.simulator.kv_events import KvEventHub
from load.simulator.model import ModelSpec
from load.simulator.options import DEFAULT_OPTIONS, SimOptions
from load.simulator.sampler import GenerationParams, Step, TokenSampler
from load.simulator.scheduler import Mailbox, Scheduler, Sequence
from load.simulator.vocab import PlausibleVocab

# The files GetTokenizer bundles (exact names, then patterns), as the engines' servicers pick them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
TOKENIZER_PATTERNS = ("*.tiktoken", "*.jinja", "*.model")
TOKENIZER_CHUNK = 64 * 1024


@dataclass
class EngineStats:
    """Counters a test (or a load report) reads in-process."""

    # Every Generate call that reached the engine, rejected ones included: the gateway's tests
    # assert this stays 0 to prove a bad request never got this far.
    generate_requests: int = 0
    rejected: int = 0  # refused with INVALID_ARGUMENT
    active: int = 0  # admitted and not finished yet
    completed: int = 0  # finished with "stop" or "length"
    aborts: int = 0  # ended by an Abort RPC
    cancelled: int = 0  # the caller went away (or the server stopped) first
    abort_calls: int = 0  # Abort RPCs received
    output_tokens: int = 0
    faults: int = 0  # requests failed or cut by an injected fault


class Request:
    """An admitted request: its choices (n sequences) and where their tokens arrive."""

    def __init__(self, request_id: str, sequences: list[Sequence], mailbox: Mailbox) -> None:
        self.request_id = request_id
        self.sequences = sequences
        self.mailbox = mailbox
        self.aborted = False
        self.faulted = False  # ended by an injected fault, not by its caller


class EngineCore:
    def __init__(
        self,
        spec: ModelSpec,
        vocab: PlausibleVocab,
        options: SimOptions = DEFAULT_OPTIONS,
        hash_seed: int = 0,
    ) -> None:
        self.spec = spec
        self.vocab = vocab
        self.options = options
        self.stats = EngineStats()
        self.faults = FaultPlan()
        self.hub = KvEventHub(self.load_record)
        self.scheduler = Scheduler(
            options, self.hub.publish, self.faults.engine, hash_seed, counters=self.stats
        )
        self.started = time.time()
        self.last_receive = 0.0
        self.finished: Counter[str] = Counter()  # requests by finish reason (per choice)
        # vLLM lets several requests share an external id; Abort ends them all.
        self._requests: dict[str, list[Request]] = {}
        self._tokenizer_zip: tuple[bytes, str] | None = None

    # --- requests -----------------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: GenerationParams,
        n: int,
        cache_limit: int | None = None,
    ) -> Request:
        loop_time = time.monotonic()
        mailbox = Mailbox(n)
        sequences = []
        for index in range(n):
            # Choices of one request differ by seed, as parallel samples do.
            choice_params = params if index == 0 else replace(params, seed=params.seed + index)
            sequences.append(
                Sequence(
                    request_id=request_id,
                    index=index,
                    prompt_len=len(prompt_ids),
                    tokens=list(prompt_ids),
                    sampler=TokenSampler(choice_params, self.spec, self.vocab),
                    mailbox=mailbox,
                    arrival=loop_time,
                    cache_limit=cache_limit,
                )
            )
        request = Request(request_id, sequences, mailbox)
        self._requests.setdefault(request_id, []).append(request)
        self.stats.active += 1
        for sequence in sequences:
            self.scheduler.add(sequence)
        return request

    def release(self, request: Request, *, cancelled: bool) -> None:
        """The handler is done with a request: free whatever it still holds."""
        for sequence in request.sequences:
            self.scheduler.finish(sequence, None, notify=False)
        requests = self._requests.get(request.request_id, [])
        if request in requests:
            requests.remove(request)
            if not requests:
                del self._requests[request.request_id]
            self.stats.active -= 1
            if cancelled:
                self.stats.cancelled += 1

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            # An unknown or finished id is not an error (vLLM ignores it too).
            for request in self._requests.get(request_id, ()):
                if request.aborted:
                    continue
                request.aborted = True
                for sequence in request.sequences:
                    if not sequence.finished:
                        self.scheduler.finish(sequence, Step(-1, "abort"))

    def fits(self, prompt_len: int) -> bool:
        return self.scheduler.fits(prompt_len)

    # --- load ---------------------------------------------------------------------------------

    @property
    def max_total_tokens(self) -> int:
        return self.options.num_blocks * self.options.block_size

    def load_fields(self) -> dict[str, int | float]:
        """The GetLoads SchedulerLoad figures, as vLLM's servicer fills them."""
        scheduler = self.scheduler
        usage = scheduler.cache.usage
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        return {
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting,
            "num_used_tokens": round(usage * self.max_total_tokens),
            "max_total_num_tokens": self.max_total_tokens,
            "token_usage": usage,
            "gen_throughput": scheduler.gen_throughput(),
            "cache_hit_rate": scheduler.cache_hit_rate(),
            "utilization": usage,
            "max_running_requests": self.options.max_num_seqs,
            "num_waiting_uncached_tokens": scheduler.waiting_uncached_tokens,
        }

    def load_record(self) -> common_pb2.EngineLoad:
        fields = self.load_fields()
        return common_pb2.EngineLoad(
            running_requests=int(fields["num_running_reqs"]),
            waiting_requests=int(fields["num_waiting_reqs"]),
            waiting_uncached_tokens=int(fields["num_waiting_uncached_tokens"]),
            token_usage=float(fields["token_usage"]),
            gen_throughput=float(fields["gen_throughput"]),
            max_running_requests=int(fields["max_running_requests"]),
            cache_hit_rate=float(fields["cache_hit_rate"]),
            num_used_tokens=int(fields["num_used_tokens"]),
            max_total_num_tokens=int(fields["max_total_num_tokens"]),
        )

    # --- tokenizer ----------------------------------------------------------------------------

    async def tokenizer_chunks(self) -> list[common_pb2.GetTokenizerChunk]:
        """The model folder's tokenizer files as a zip, in 64 KiB chunks; the last carries its sha256."""
        if self._tokenizer_zip is None:
            self._tokenizer_zip = await asyncio.to_thread(build_tokenizer_zip, self.spec.model_dir)
        data, digest = self._tokenizer_zip
        chunks = []
        for offset in range(0, len(data), TOKENIZER_CHUNK):
            end = min(offset + TOKENIZER_CHUNK, len(data))
            chunks.append(
                common_pb2.GetTokenizerChunk(data=data[offset:end], sha256=digest if end == len(data) else "")
            )
        return chunks

    async def stop(self) -> None:
        self.hub.close()
        await self.scheduler.stop()


def build_tokenizer_zip(directory: Path) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    added: set[str] = set()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        candidates = [directory / name for name in TOKENIZER_FILES]
        for pattern in TOKENIZER_PATTERNS:
            candidates.extend(sorted(directory.glob(pattern)))
        for path in candidates:
            if path.is_file() and path.name not in added:
                archive.write(path.resolve(), path.name)
                added.add(path.name)
    if not added:
        raise FileNotFoundError(f"no tokenizer files in {directory}")
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()
