"""SubscribeKvEvents: the cache's events as `common.proto` KvEventBatch messages, with load records.

What a subscriber sees, as vLLM's gRPC servicer relays its engine's ZMQ publisher (checked against a real
engine by tests/contract):

- one batch per scheduler step that changed the cache, numbered from 0 by the engine (one counter for the
  engine's life, not per stream), timestamped, `dp_rank` 0, its events numbered per stream from 1;
- Stored events list one `KvBlock` per block (hash, its token ids, block size) with the parent's hash
  when the run does not start the chain, on the device tier, medium "GPU", group 0, full attention, local;
- every batch carries the engine's load record (`EngineLoad`, the GetLoads figures, `sample` counting up
  per stream); telemetry (hit rate, token counts) only on the stream's first record and on heartbeats;
- between batches, a `load_only` batch repeating the last sequence number when the load moved (checked
  every 100 ms) or after 1 s of silence (5 s once two heartbeats in a row were unchanged); nothing before
  the stream's first batch;
- a non-zero `start_sequence_number` is refused with OUT_OF_RANGE: there is no history to resume from.

With several data-parallel ranks each rank is a publisher of its own, as in vLLM: its batches carry its
`dp_rank` and their own sequence from 0, its load record and heartbeats are that rank's (a rank's
heartbeats start after its first batch on the stream, its telemetry rides its first record); `sample`
still counts up per stream, over every rank's records. One stream carries every rank.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
from smg_grpc_proto.generated import common_pb2

from extproc.simulator.kv_cache import Cleared, KvEvent, Removed, Stored

LOAD_TICK_S = 0.1
HEARTBEAT_S = 1.0
HEARTBEAT_BACKOFF_S = 5.0
# A subscriber this far behind is dropped (its stream ends) rather than buffering without bound.
MAX_BACKLOG = 10_000
_TELEMETRY = ("cache_hit_rate", "num_used_tokens", "max_total_num_tokens")

LoadSource = Callable[[], common_pb2.EngineLoad]
RankLoadSource = Callable[[int], common_pb2.EngineLoad]  # a rank's load record


def _stored(event: Stored) -> common_pb2.KvBlocksStored:
    size = event.block_size
    blocks = [
        common_pb2.KvBlock(
            block_hash=h, token_ids=event.token_ids[i * size : (i + 1) * size], block_size=size
        )
        for i, h in enumerate(event.block_hashes)
    ]
    stored = common_pb2.KvBlocksStored(
        blocks=blocks,
        tier=common_pb2.KV_CACHE_TIER_DEVICE,
        medium="GPU",
        group_idx=0,
        kv_cache_spec_kind="full_attention",
        locality=common_pb2.KV_CACHE_LOCALITY_LOCAL,
    )
    if event.parent_hash is not None:
        stored.parent_block_hash = event.parent_hash
    return stored


def to_proto(event: KvEvent, event_id: int) -> common_pb2.KvCacheEvent:
    if isinstance(event, Stored):
        return common_pb2.KvCacheEvent(event_id=event_id, stored=_stored(event))
    if isinstance(event, Removed):
        removed = common_pb2.KvBlocksRemoved(
            block_hashes=event.block_hashes,
            tier=common_pb2.KV_CACHE_TIER_DEVICE,
            medium="GPU",
            group_idx=0,
            locality=common_pb2.KV_CACHE_LOCALITY_LOCAL,
        )
        return common_pb2.KvCacheEvent(event_id=event_id, removed=removed)
    assert isinstance(event, Cleared)
    return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())


def load_changed(last: common_pb2.EngineLoad, current: common_pb2.EngineLoad) -> bool:
    """Worth a heartbeat: a count changed, KV usage moved by half a percent, the rate by 5 % or 50/s."""
    if (
        last.running_requests != current.running_requests
        or last.waiting_requests != current.waiting_requests
        or last.waiting_uncached_tokens != current.waiting_uncached_tokens
        or last.max_running_requests != current.max_running_requests
        or abs(last.token_usage - current.token_usage) > 0.005
    ):
        return True
    delta = abs(last.gen_throughput - current.gen_throughput)
    return delta > 50.0 or delta > 0.05 * max(last.gen_throughput, current.gen_throughput)


class _Recorder:
    """One rank's load records on one stream: numbered, telemetry-trimmed, paced."""

    def __init__(self, source: LoadSource, rank: int, samples: Iterator[int]) -> None:
        self._source = source
        self.rank = rank
        self._samples = samples  # shared by the stream's ranks: `sample` counts up per stream
        self._first = True
        self._last: common_pb2.EngineLoad | None = None
        self._last_sent = time.monotonic()
        self._unchanged = 0
        self.last_sequence: int | None = None
        # When this rank's load is next looked at for a heartbeat: a tick after its last batch or look.
        self.next_check = time.monotonic() + LOAD_TICK_S

    def _numbered(self, current: common_pb2.EngineLoad, *, load_only: bool) -> common_pb2.EngineLoad:
        record = common_pb2.EngineLoad()
        record.CopyFrom(current)
        record.sample = next(self._samples)
        record.load_only = load_only
        if not load_only and not self._first:
            for name in _TELEMETRY:
                record.ClearField(name)
        self._first = False
        self._last = current
        return record

    def stamp(self, batch: common_pb2.KvEventBatch) -> common_pb2.KvEventBatch:
        self.last_sequence = batch.sequence_number
        self._last_sent = time.monotonic()
        self.next_check = self._last_sent + LOAD_TICK_S
        self._unchanged = 0
        batch.load.CopyFrom(self._numbered(self._source(), load_only=False))
        return batch

    def heartbeat(self) -> common_pb2.KvEventBatch | None:
        if self.last_sequence is None:
            return None
        current = self._source()
        changed = self._last is None or load_changed(self._last, current)
        due = HEARTBEAT_BACKOFF_S if self._unchanged >= 2 else HEARTBEAT_S
        if not changed and time.monotonic() - self._last_sent < due:
            return None
        record = self._numbered(current, load_only=True)
        self._last_sent = time.monotonic()
        self._unchanged = 0 if changed else self._unchanged + 1
        batch = common_pb2.KvEventBatch(
            sequence_number=self.last_sequence, timestamp=time.time(), dp_rank=self.rank
        )
        batch.load.CopyFrom(record)
        return batch


def _due_heartbeats(recorders: list[_Recorder]) -> list[common_pb2.KvEventBatch]:
    """Look at every rank whose tick has come (even while other ranks' batches keep the stream busy)."""
    now = time.monotonic()
    heartbeats = []
    for recorder in recorders:
        if recorder.next_check <= now:
            recorder.next_check = now + LOAD_TICK_S
            heartbeat = recorder.heartbeat()
            if heartbeat is not None:
                heartbeats.append(heartbeat)
    return heartbeats


def _until_due(recorders: list[_Recorder]) -> float:
    return max(min(r.next_check for r in recorders) - time.monotonic(), 0.0)


# A published batch as queued for a stream: (rank, sequence, timestamp, events); None ends the stream.
_Item = tuple[int, int, float, list[KvEvent]]
Listener = Callable[[list[KvEvent]], None]


class KvEventHub:
    """Fans one engine's event batches out to its subscribers, each DP rank numbering its own."""

    def __init__(self, load_source: RankLoadSource, ranks: int = 1) -> None:
        self._load_source = load_source
        self.ranks = ranks
        self._sequences = [-1] * ranks  # vLLM's publishers number their first batch 0, one per rank
        self._subscribers: set[asyncio.Queue[_Item | None]] = set()
        # Other channels that publish a rank's batches too (vLLM's ZMQ publisher), in the hub's order.
        self._listeners: list[list[Listener]] = [[] for _ in range(ranks)]
        self.batches = 0  # over every rank

    def add_listener(self, listener: Listener, rank: int = 0) -> None:
        self._listeners[rank].append(listener)

    def publisher(self, rank: int) -> Listener:
        """What rank `rank`'s scheduler publishes its steps' events with."""

        def publish(events: list[KvEvent]) -> None:
            self.publish(events, rank)

        return publish

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, events: list[KvEvent], rank: int = 0) -> None:
        self._sequences[rank] += 1
        self.batches += 1
        item = (rank, self._sequences[rank], time.time(), events)
        for queue in list(self._subscribers):
            if queue.qsize() >= MAX_BACKLOG:
                self._subscribers.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(item)
        for listener in self._listeners[rank]:
            listener(events)

    def restart(self) -> None:
        """A new process: every stream ends and each rank numbers its batches from 0 again."""
        self.close()
        self._sequences = [-1] * self.ranks

    def close(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._subscribers.clear()

    async def subscribe(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        # No rank keeps history, so no cursor (one rank's or several's) can be resumed.
        if request.start_sequence_number:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                "KV event replay cursors are per subscription; resubscribe with zero and rebuild",
            )
        queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._subscribers.add(queue)
        samples = itertools.count(1)
        recorders = [
            _Recorder(functools.partial(self._load_source, rank), rank, samples) for rank in range(self.ranks)
        ]
        event_id = 0
        try:
            await context.send_initial_metadata(())
            while True:
                for heartbeat in _due_heartbeats(recorders):
                    yield heartbeat
                try:
                    item = await asyncio.wait_for(queue.get(), _until_due(recorders))
                except TimeoutError:
                    continue
                if item is None:
                    return
                rank, sequence, timestamp, events = item
                batch = common_pb2.KvEventBatch(sequence_number=sequence, timestamp=timestamp, dp_rank=rank)
                for event in events:
                    event_id += 1
                    batch.events.append(to_proto(event, event_id))
                yield recorders[rank].stamp(batch)
        finally:
            self._subscribers.discard(queue)
