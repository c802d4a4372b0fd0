"""The engine core: continuous batching over a paged KV cache, one simulated step at a time.

Each step, as vLLM's v1 scheduler plans it: running sequences first (one token each when decoding, the
next chunk of a prompt when prefilling), then waiting ones in arrival order while the running window
(`max_num_seqs`) and the step's token budget (`max_num_batched_tokens`) allow and the cache has blocks for
them. A waiting sequence starts from its longest cached prefix (never its last token: that one is always
computed, so a fully cached prompt still reports one block less). A running sequence that needs a block
when none is free preempts the newest running sequence (its blocks are freed and it recomputes later).

The step then "runs" for the time `SimOptions` gives it, and every sequence that finished its prompt or
decoded samples one token, published to its request's `Mailbox`. KV events from the step go out as one
batch afterwards, as vLLM publishes them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from extproc.simulator.kv_cache import Allocation, KvCache, KvEvent
from extproc.simulator.logprobs import TokenLogprob
from extproc.simulator.metrics import Histogram
from extproc.simulator.options import SimOptions
from extproc.simulator.sampler import Step, TokenSampler

# Windows of the load figures, as vLLM's gRPC servicer keeps them.
THROUGHPUT_WINDOW_S = 2.0
HIT_RATE_SAMPLES = 64


class News(NamedTuple):
    """What one choice produced since the handler last looked."""

    index: int
    tokens: list[int]
    logprobs: list[TokenLogprob]  # one per token when the request asked for logprobs, else empty
    finish: Step | None


class Mailbox:
    """One request's news from the scheduler, per choice index: tokens since the last take, and the end.

    The handler takes everything pending at once (a reader that fell behind finds several steps' tokens).
    """

    def __init__(self, n: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        self.finish: list[Step | None] = [None] * n
        self.cached: list[int] = [0] * n
        self.dirty: set[int] = set()
        self._waiter: asyncio.Future[None] | None = None

    def push(
        self, index: int, token: int | None, finish: Step | None = None, logprob: TokenLogprob | None = None
    ) -> None:
        if token is not None:
            self.tokens[index].append(token)
        if logprob is not None:
            self.logprobs[index].append(logprob)
        if finish is not None:
            self.finish[index] = finish
        self.dirty.add(index)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        while not self.dirty:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def take(self) -> list[News]:
        """News of every choice that has some, by index."""
        news = []
        for index in sorted(self.dirty):
            tokens, self.tokens[index] = self.tokens[index], []
            logprobs = self.logprobs[index]
            if logprobs:
                self.logprobs[index] = []
            news.append(News(index, tokens, logprobs, self.finish[index]))
        self.dirty.clear()
        return news


@dataclass(eq=False)
class Sequence:
    """One choice of a request: its tokens so far and how much of them the cache has computed."""

    request_id: str
    index: int
    prompt_len: int
    tokens: list[int]  # prompt, then output as it is sampled
    sampler: TokenSampler
    mailbox: Mailbox
    arrival: float
    num_computed: int = 0
    cached_tokens: int | None = None  # the prefix hit when first scheduled
    # The most prompt tokens it may read from the prefix cache (None: no limit). Prompt logprobs need
    # the prompt computed: vLLM skips the cache for them, SGLang reads it up to logprob_start_len.
    cache_limit: int | None = None
    allocation: Allocation = field(default_factory=Allocation)
    finished: bool = False
    _hashes: list[int] | None = None
    _hashed_len: int = 0

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    def chain_hashes(self, cache: KvCache) -> list[int]:
        if self._hashes is None or self._hashed_len != len(self.tokens):
            self._hashes = cache.chain_hashes(self.tokens)
            self._hashed_len = len(self.tokens)
        return self._hashes


@dataclass
class StepStats:
    """What the last steps did, for load reports and metrics."""

    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens of sequences started (vLLM's prefix-cache queries)
    cached_tokens: int = 0  # of which served from the cache (its hits)
    preemptions: int = 0
    generated: deque[tuple[float, int]] = field(default_factory=deque)
    first_outputs: deque[tuple[int, int]] = field(default_factory=deque)
    ttft: Histogram = field(default_factory=Histogram)


class Faults:
    """Engine-wide slow-downs the scheduler obeys: a stall freezes it, `slow` stretches every step."""

    def __init__(self) -> None:
        self.slow = 1.0
        self._running = asyncio.Event()
        self._running.set()

    @property
    def stalled(self) -> bool:
        return not self._running.is_set()

    def stall(self, on: bool) -> None:
        if on:
            self._running.clear()
        else:
            self._running.set()

    async def wait_running(self) -> None:
        await self._running.wait()


class Scheduler:
    def __init__(
        self,
        options: SimOptions,
        publish_events: Callable[[list[KvEvent]], None],
        faults: Faults | None = None,
        hash_seed: int = 0,
        counters: Any = None,
    ) -> None:
        self.options = options
        # Anything with an `output_tokens` attribute (the engine's stats) counts generated tokens.
        self.counters = counters
        self.faults = faults or Faults()
        self._events: list[KvEvent] = []
        self.cache = KvCache(options.num_blocks, options.block_size, self._events.append, hash_seed)
        self._publish = publish_events
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = StepStats()
        self.output_tokens = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_end = 0.0
        # Called after every step and every admission/finish: load watchers (the KV-event streams).
        self.on_change: list[Callable[[], None]] = []

    # --- requests ---------------------------------------------------------------------------------

    def fits(self, prompt_len: int) -> bool:
        """Whether a prompt could ever be scheduled: its blocks plus one for output fit the cache."""
        return math.ceil((prompt_len + 1) / self.options.block_size) <= self.options.num_blocks

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._changed()

    def finish(self, sequence: Sequence, finish: Step | None, *, notify: bool = True) -> None:
        """End a sequence now (finished, aborted or cancelled) and free its blocks."""
        if sequence.finished:
            return
        sequence.finished = True
        if sequence in self.running:
            self.running.remove(sequence)
        else:
            try:
                self.waiting.remove(sequence)
            except ValueError:
                pass
        self.cache.free(sequence.allocation)
        if notify and finish is not None:
            sequence.mailbox.push(sequence.index, None, finish)
        self._changed()

    def flush_cache(self) -> bool:
        """vLLM's reset_prefix_cache: refused while any request holds blocks."""
        if not self.cache.reset():
            return False
        # vLLM publishes with its next step; the simulator has no idle steps, so it publishes now.
        self._flush_events()
        return True

    def restart(self) -> None:
        """As the engine's process starting again: every sequence ends unannounced (its caller went with
        the old process), the cache is empty and nothing of the old one is published. Counters carry on,
        so a benchmark can difference them across the restart."""
        for sequence in [*self.running, *self.waiting]:
            self.finish(sequence, None, notify=False)
        self.cache.reset()
        self._events.clear()  # a new process announces no clearing: its stream simply starts afresh

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # --- load figures -----------------------------------------------------------------------------

    @property
    def waiting_uncached_tokens(self) -> int:
        total = 0
        for sequence in self.waiting:
            hit = self.cache.longest_hit(sequence.chain_hashes(self.cache)) * self.options.block_size
            total += max(len(sequence.tokens) - hit, 0)
        return total

    def gen_throughput(self) -> float:
        self._trim(time.monotonic())
        return sum(n for _, n in self.stats.generated) / THROUGHPUT_WINDOW_S

    def cache_hit_rate(self) -> float:
        prompt = sum(p for p, _ in self.stats.first_outputs)
        cached = sum(c for _, c in self.stats.first_outputs)
        return min(1.0, cached / prompt) if prompt else 0.0

    def _trim(self, now: float) -> None:
        generated = self.stats.generated
        while generated and now - generated[0][0] > THROUGHPUT_WINDOW_S:
            generated.popleft()

    def _changed(self) -> None:
        for callback in self.on_change:
            callback()

    # --- the step loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._last_end = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                self._last_end = loop.time()  # idle time is not owed to the next step
            if self.faults.stalled:
                await self.faults.wait_running()
                self._last_end = loop.time()
            plan = self._schedule()
            duration = self._duration(plan) * self.options.time_scale * self.faults.slow
            # Absolute deadlines: per-step overhead does not stretch the simulated rate.
            end = max(self._last_end, loop.time() - 0.05) + duration
            self._last_end = end
            delay = end - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            self._apply(plan)

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.options.block_size)

    def _schedule(self) -> list[tuple[Sequence, int, bool]]:
        """This step's work: (sequence, tokens to compute, whether it is prefill)."""
        options = self.options
        budget = options.max_num_batched_tokens
        plan: list[tuple[Sequence, int, bool]] = []
        preempted = False
        for sequence in list(self.running):
            if budget <= 0:
                break
            if sequence.finished or sequence not in self.running:
                continue  # preempted by an earlier sequence of this step
            remaining = len(sequence.tokens) - sequence.num_computed
            count = min(remaining, budget)
            need = self._blocks_for(sequence.num_computed + count) - len(sequence.allocation.blocks)
            while need > 0 and not self.cache.can_allocate(need):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is sequence:
                    break
            if sequence not in self.running:
                continue
            if need > 0:
                self.cache.allocate(need, sequence.allocation)
            plan.append((sequence, count, sequence.output_len == 0 or remaining > 1))
            budget -= count
        while self.waiting and budget > 0 and len(self.running) < options.max_num_seqs and not preempted:
            sequence = self.waiting[0]
            hashes = sequence.chain_hashes(self.cache)
            size = options.block_size
            hit = min(self.cache.longest_hit(hashes), (len(sequence.tokens) - 1) // size)
            if sequence.cache_limit is not None:
                hit = min(hit, sequence.cache_limit // size)
            count = min(len(sequence.tokens) - hit * size, budget)
            need = self._blocks_for(hit * size + count) - hit
            revived = sum(1 for h in hashes[:hit] if self.cache.is_free(h))
            if not self.cache.can_allocate(need + revived):
                break
            self.waiting.popleft()
            self.cache.allocate_prefix(hashes, hit, sequence.allocation)
            self.cache.allocate(need, sequence.allocation)
            sequence.num_computed = hit * size
            if sequence.cached_tokens is None:
                sequence.cached_tokens = hit * size
                sequence.mailbox.cached[sequence.index] = hit * size
                self.stats.prompt_tokens += len(sequence.tokens)
                self.stats.cached_tokens += hit * size
            self.running.append(sequence)
            plan.append((sequence, count, True))
            budget -= count
        if plan:
            self._changed()
        return plan

    def _preempt(self, sequence: Sequence) -> None:
        """Free a running sequence's blocks and queue it first to recompute (vLLM's recompute mode)."""
        self.running.remove(sequence)
        self.cache.free(sequence.allocation)
        sequence.num_computed = 0
        self.waiting.appendleft(sequence)
        self.stats.preemptions += 1

    def _duration(self, plan: list[tuple[Sequence, int, bool]]) -> float:
        options = self.options
        prefill = sum(count for _, count, is_prefill in plan if is_prefill)
        decoding = sum(1 for _, _, is_prefill in plan if not is_prefill)
        if not plan:
            return 0.0
        base = options.ttft_ms + options.prefill_ms_per_token * prefill if prefill else options.itl_ms
        return (base + options.decode_ms_per_seq * decoding) / 1000

    def _apply(self, plan: list[tuple[Sequence, int, bool]]) -> None:
        now = time.monotonic()
        generated = 0
        for sequence, count, _ in plan:
            if sequence.finished or sequence not in self.running:
                continue  # aborted or preempted while the step ran
            sequence.num_computed += count
            self.cache.publish_full_blocks(sequence.allocation, sequence.tokens, sequence.num_computed)
            if sequence.num_computed < len(sequence.tokens):
                continue  # a chunk of a long prompt: no token yet
            if sequence.output_len == 0:
                self.stats.ttft.observe(now - sequence.arrival)
                first = self.stats.first_outputs
                first.append((sequence.prompt_len, sequence.cached_tokens or 0))
                if len(first) > HIT_RATE_SAMPLES:
                    first.popleft()
            step = sequence.sampler.next_step()
            sequence.tokens.append(step.token_id)
            generated += 1
            sequence.mailbox.push(sequence.index, step.token_id, logprob=step.logprob)
            if step.finish_reason is not None:
                self.finish(sequence, step)
            elif not self._room_left(sequence):
                # Only when the cache cannot hold even this one sequence: end it rather than wait forever.
                self.finish(sequence, Step(step.token_id, "length"))
        self.stats.steps += 1
        self.output_tokens += generated
        if self.counters is not None:
            self.counters.output_tokens += generated
        if generated:
            self.stats.generated.append((now, generated))
            self._trim(now)
        self._flush_events()
        self._changed()

    def _room_left(self, sequence: Sequence) -> bool:
        return self._blocks_for(len(sequence.tokens) + 1) <= self.options.num_blocks

    def _flush_events(self) -> None:
        if self._events:
            events = list(self._events)
            self._events.clear()
            self._publish(events)
