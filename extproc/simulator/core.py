"""What one simulated engine is, whatever protocol it speaks: model facts, schedulers, KV caches, events,
load figures, counters and faults. The protocol servicers (`engine.VllmEngine`, `sglang.SglangEngine`)
translate their messages to and from this.

With `data_parallel_size` > 1 the engine holds one scheduler (and KV cache) per data-parallel rank, as a
vLLM or SGLang engine with DP ranks behind one address: a request pinned to a rank runs there, an unpinned
one goes to the rank with the fewest running and waiting sequences (the lowest on ties), as vLLM's DP
coordinator roughly balances. Faults, counters and the request table are the engine's, shared by ranks.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zipfile
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path

from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2
from tokenizers import Tokenizer

from extproc.simulator import constraints
from extproc.simulator.faults import FaultPlan
from extproc.simulator.kv_events import KvEventHub
from extproc.simulator.model import ModelSpec
from extproc.simulator.options import DEFAULT_OPTIONS, TIMING_FIELDS, SimOptions
from extproc.simulator.planned import OutputPlan
from extproc.simulator.request_log import RequestLog
from extproc.simulator.sampler import GenerationParams, Step, TokenSampler
from extproc.simulator.scheduler import Mailbox, Scheduler, Sequence
from extproc.simulator.script import Script
from extproc.simulator.vocab import PlausibleVocab, load_tokenizer

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


@dataclass(frozen=True)
class RecordedCall:
    """A Generate call as the engine received it (`SimOptions.record_calls`)."""

    request_id: str
    # The call's gRPC metadata (lower-case keys; `-bin` values are bytes), as the server saw it.
    metadata: tuple[tuple[str, str | bytes], ...]
    # Seconds left before the call's deadline when it arrived (a caller's `grpc-timeout`); None: none.
    deadline_s: float | None

    def header(self, name: str) -> str | bytes | None:
        return next((v for k, v in self.metadata if k == name), None)


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
    """An admitted request: its choices (n sequences), where their tokens arrive and the rank running it."""

    def __init__(self, request_id: str, sequences: list[Sequence], mailbox: Mailbox, rank: int = 0) -> None:
        self.request_id = request_id
        self.sequences = sequences
        self.mailbox = mailbox
        self.rank = rank
        self.aborted = False
        self.faulted = False  # ended by an injected fault, not by its caller


class EngineCore:
    def __init__(
        self,
        spec: ModelSpec,
        vocab: PlausibleVocab,
        options: SimOptions = DEFAULT_OPTIONS,
        hash_seed: int = 0,
        script: Script | None = None,
    ) -> None:
        self.spec = spec
        self.vocab = vocab
        self.options = options
        self._start_options = options  # what `retime()` with no changes goes back to
        self.stats = EngineStats()
        self.faults = FaultPlan()
        self.hub = KvEventHub(self.load_record, options.data_parallel_size)
        # One scheduler and cache per DP rank; the fault plan's stall and slow-down reach every rank.
        self.schedulers = [
            Scheduler(options, self.hub.publisher(rank), self.faults.engine, hash_seed, counters=self.stats)
            for rank in range(options.data_parallel_size)
        ]
        self.started = time.time()
        self.last_receive = 0.0
        # The last Generate calls (SimOptions.record_calls), oldest first; stays empty when that is 0.
        self.recorded: deque[RecordedCall] = deque(maxlen=max(options.record_calls, 1))
        self.finished: Counter[str] = Counter()  # requests by finish reason (per choice)
        # vLLM lets several requests share an external id; Abort ends them all.
        self._requests: dict[str, list[Request]] = {}
        self._tokenizer_zip: tuple[bytes, str] | None = None
        # Scripted outputs: the configured rules for this model, and those added at run time (a cluster's
        # engines share one, so a rule that answers one request does so whichever engine gets it).
        self.script = script if script is not None else Script(options.script, spec.served_name)
        # Set by the cluster when asked to log where each request went (`request_log.py`).
        self.request_log: RequestLog | None = None

    def retime(self, **changes: float) -> SimOptions:
        """New timing (TIMING_FIELDS) for every step and stream from now on; none given: the start's."""
        unknown = set(changes) - set(TIMING_FIELDS)
        if unknown:
            raise ValueError(f"not a timing option: {', '.join(sorted(unknown))}")
        base = self.options if changes else self._start_options
        self.options = replace(base, **changes)  # validated by SimOptions
        for scheduler in self.schedulers:
            scheduler.options = self.options
        return self.options

    def timing(self) -> dict[str, float]:
        return {name: getattr(self.options, name) for name in TIMING_FIELDS}

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (shared per process), for scripted and constrained outputs."""
        return load_tokenizer((self.spec.model_dir / "tokenizer.json").resolve())

    @property
    def scheduler(self) -> Scheduler:
        """Rank 0's scheduler: the engine's only one without data parallelism."""
        return self.schedulers[0]

    @property
    def data_parallel_size(self) -> int:
        return len(self.schedulers)

    # --- requests -----------------------------------------------------------------------------

    def check_rank(self, rank: int | None) -> None:
        """A pinned rank must exist (vLLM's message); a ValueError is the client's fault."""
        size = self.data_parallel_size
        if rank is not None and not 0 <= rank < size:
            raise ValueError(f"data_parallel_rank {rank} is out of range [0, {size}).")

    def pick_rank(self) -> int:
        """The rank an unpinned request goes to: the fewest running and waiting sequences, lowest first."""

        def queued(rank: int) -> tuple[int, int]:
            scheduler = self.schedulers[rank]
            return len(scheduler.running) + len(scheduler.waiting), rank

        return min(range(self.data_parallel_size), key=queued)

    def plan_output(
        self, prompt_ids: list[int], sampling: vllm_engine_pb2.SamplingParams, seeds: range
    ) -> OutputPlan | None:
        """What the request says instead of plausible words (a constraint's output, a scripted text), or
        None. Every choice's output is made now (`seeds`), so a constraint the simulator cannot honour
        is refused (ValueError) before the request is admitted."""
        constraint = constraints.from_sampling(sampling)
        text = self.script.pick(lambda: self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if constraint is None and text is None:
            return None
        plan = OutputPlan(self.tokenizer, text, constraint)
        for seed in seeds:
            plan.tokens(seed)
        return plan

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: GenerationParams,
        n: int,
        cache_limit: int | None = None,
        rank: int | None = None,
    ) -> Request:
        """Admit a request on `rank` (checked by `check_rank` before), or on the least busy rank."""
        rank = self.pick_rank() if rank is None else rank
        scheduler = self.schedulers[rank]
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
        if self.request_log is not None:
            self.request_log.observe(self, rank, request_id, sequences[0])
        request = Request(request_id, sequences, mailbox, rank)
        self._requests.setdefault(request_id, []).append(request)
        self.stats.active += 1
        for sequence in sequences:
            scheduler.add(sequence)
        return request

    def release(self, request: Request, *, cancelled: bool) -> None:
        """The handler is done with a request: free whatever it still holds."""
        scheduler = self.schedulers[request.rank]
        for sequence in request.sequences:
            scheduler.finish(sequence, None, notify=False)
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
            # An unknown or finished id is not an error (vLLM ignores it too). Each request remembers
            # its rank, so an abort reaches whichever rank holds it.
            for request in self._requests.get(request_id, ()):
                if request.aborted:
                    continue
                request.aborted = True
                scheduler = self.schedulers[request.rank]
                for sequence in request.sequences:
                    if not sequence.finished:
                        scheduler.finish(sequence, Step(-1, "abort"))

    def fits(self, prompt_len: int) -> bool:
        return self.scheduler.fits(prompt_len)  # every rank has the same cache size

    def flush_cache(self) -> bool:
        """Flush every rank's prefix cache, or none: refused while any rank's requests hold blocks."""
        if any(scheduler.cache.used_blocks for scheduler in self.schedulers):
            return False
        return all([scheduler.flush_cache() for scheduler in self.schedulers])

    def restart(self) -> None:
        """The engine as a new process: requests dropped, caches empty, KV-event sequences from 0 (the
        hosting server cuts the calls: `SimEngine.restart`)."""
        for scheduler in self.schedulers:
            scheduler.restart()
        self._requests.clear()
        self.stats.active = 0
        self.hub.restart()

    # --- load ---------------------------------------------------------------------------------

    @property
    def max_total_tokens(self) -> int:
        """One rank's KV capacity in tokens."""
        return self.options.num_blocks * self.options.block_size

    def ranks(self, dp_rank: int | None = None) -> list[int]:
        """The ranks a GetLoads asks for: all, or the one it filters on (none when that does not exist)."""
        if dp_rank is None:
            return list(range(self.data_parallel_size))
        return [dp_rank] if 0 <= dp_rank < self.data_parallel_size else []

    def load_fields(self, rank: int = 0) -> dict[str, int | float]:
        """A rank's GetLoads SchedulerLoad figures, as vLLM's servicer fills them."""
        scheduler = self.schedulers[rank]
        usage = scheduler.cache.usage
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        return {
            "dp_rank": rank,
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

    def load_record(self, rank: int = 0) -> common_pb2.EngineLoad:
        """A rank's load record, as the KV-event streams attach it."""
        fields = self.load_fields(rank)
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
        await asyncio.gather(*(scheduler.stop() for scheduler in self.schedulers))


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
