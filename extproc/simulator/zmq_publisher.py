"""vLLM's ZMQ KV-event channel: an engine's cache events as msgpack batches on a PUB socket, and an optional
ROUTER socket that replays recent batches to a consumer that missed some.

What a consumer sees, as vLLM 0.32's `ZmqEventPublisher` sends it (vllm/distributed/kv_events.py; the
payloads are checked with vLLM's own msgspec decoder by tests/simulator/test_simulator_zmq.py):

- one multipart message per batch: topic, sequence number (8 bytes big-endian), payload. Sequences count
  the engine's batches from 0, the numbers SubscribeKvEvents reports for the same batches;
- the payload is vLLM's `KVEventBatch` struct as msgspec encodes it: an array `[ts, events, dp_rank]`;
  each event a map tagged by "type" (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) with its fields in
  declaration order, fields equal to their declared default left out (omit_defaults);
- block hashes are unsigned 64-bit integers (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1); the
  simulator's hashes are the signed int64 that the gRPC relay makes of them;
- `BlockStored` per run of newly cached full blocks (parent hash or None, the blocks' token ids, block size,
  no LoRA, medium "GPU", `extra_keys` one None per block, group 0, kind "full_attention"), one
  `BlockRemoved` per evicted block, `AllBlocksCleared` after FlushCache (what a real engine sent here);
- replay: a DEALER sends `(b"", start sequence as 8 bytes big-endian)` to the ROUTER and receives every
  kept batch from that sequence on as `(b"", topic, sequence, payload)`, then the end marker
  `(b"", b"", -1 as 8 signed bytes, b"")`. The last 10,000 batches are kept.

Endpoints follow vLLM's rule: a PUB endpoint with "*" or "::" in it, or an ipc:// or inproc:// one, is
bound; any other (tcp://host:port) is connected to, for consumers that bind. The replay endpoint is always
bound.

Data-parallel ranks: as in vLLM, every rank has a publisher of its own, on the endpoint offset by its rank,
numbering its own batches from 0 (those of its SubscribeKvEvents batches) with its rank in the payload.
Engine i's rank r takes slot i * data_parallel_size + r: a tcp port raised by the slot, or "{i}" replaced
by it, so one engine's ranks sit on consecutive ports and the engines follow each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from extproc.simulator.kv_cache import Cleared, KvEvent, Removed, Stored
from extproc.simulator.kv_events import KvEventHub
from extproc.simulator.options import SimOptions

logger = logging.getLogger(__name__)

# vLLM's KVEventsConfig defaults.
BUFFER_STEPS = 10_000
HWM = 100_000
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# Replies to one replay request yield to the event loop this often, so engine steps stay on time.
REPLAY_YIELD_EVERY = 256
_U64 = (1 << 64) - 1
MEDIUM = "GPU"


def _u64(block_hash: int) -> int:
    return block_hash & _U64


def event_maps(event: KvEvent) -> list[dict[str, Any]]:
    """vLLM's events for one simulator event, as msgspec lays out its tagged structs."""
    if isinstance(event, Stored):
        return [
            {
                "type": "BlockStored",
                "block_hashes": [_u64(h) for h in event.block_hashes],
                "parent_block_hash": None if event.parent_hash is None else _u64(event.parent_hash),
                "token_ids": list(event.token_ids),
                "block_size": event.block_size,
                "lora_id": None,
                "medium": MEDIUM,
                "lora_name": None,
                "extra_keys": [None] * len(event.block_hashes),
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }
        ]
    if isinstance(event, Removed):
        # vLLM's block pool emits one BlockRemoved per evicted block.
        return [
            {"type": "BlockRemoved", "block_hashes": [_u64(h)], "medium": MEDIUM, "group_idx": 0}
            for h in event.block_hashes
        ]
    assert isinstance(event, Cleared)
    return [{"type": "AllBlocksCleared"}]


def encode_batch(timestamp: float, events: list[KvEvent], dp_rank: int = 0) -> bytes:
    """A `KVEventBatch` payload: array-like [ts, events, data_parallel_rank]."""
    maps = [m for event in events for m in event_maps(event)]
    return msgpack.packb([timestamp, maps, dp_rank])


def endpoint_for(template: str, index: int, count: int) -> str:
    """Slot `index`'s endpoint (an engine's, or with DP ranks an engine rank's): "{i}" replaced by the
    index, else a tcp port raised by it (vLLM's rule for data-parallel ranks; port 0 stays 0, a free port
    each)."""
    if "{i}" in template:
        return template.replace("{i}", str(index))
    if template.startswith("tcp://"):
        head, _, port = template.rpartition(":")
        if port.isdigit() and int(port):
            return f"{head}:{int(port) + index}"
        return template
    if count > 1:
        raise ValueError(f"{template}: several engines or DP ranks need '{{i}}' in a non-tcp endpoint")
    return template


def _is_bind_endpoint(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)  # the real port where 0 asked for a free one


class ZmqKvPublisher:
    """One engine's PUB socket (and replay ROUTER), fed with the scheduler's event batches."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        dp_rank: int = 0,
        buffer_steps: int = BUFFER_STEPS,
        hwm: int = HWM,
    ) -> None:
        context = zmq.Context.instance()  # one I/O thread for every engine of the process
        self._topic = topic.encode()
        self._dp_rank = dp_rank
        self._sequence = 0
        # Kept for replay only (vLLM keeps it always; 10,000 batches per engine add up over a fleet).
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps if replay_endpoint else 0)
        # The ROUTER's owning socket must stay referenced: collecting it would close the async shadow's.
        self._router: zmq.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.replay_endpoint: str | None = None
        self._pub = context.socket(zmq.PUB)
        try:
            self._pub.set_hwm(hwm)
            if _is_bind_endpoint(endpoint):
                self.endpoint = _bind(self._pub, endpoint)
            else:
                self._pub.connect(endpoint)
                self.endpoint = endpoint
            if replay_endpoint is not None:
                self._router = context.socket(zmq.ROUTER)
                self._replay = zmq.asyncio.Socket.from_socket(self._router)
                self.replay_endpoint = _bind(self._router, replay_endpoint)
                self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())
        except BaseException:
            self._close_sockets()
            raise

    @classmethod
    def for_engine(cls, options: SimOptions, index: int, count: int, rank: int = 0) -> ZmqKvPublisher:
        """Rank `rank` of engine `index` (of `count`): on the endpoints of slot index * DP size + rank."""
        assert options.kv_events_zmq is not None
        size = options.data_parallel_size
        slot, slots = index * size + rank, count * size
        replay = options.kv_events_zmq_replay
        return cls(
            endpoint_for(options.kv_events_zmq, slot, slots),
            replay_endpoint=None if replay is None else endpoint_for(replay, slot, slots),
            topic=options.kv_events_zmq_topic,
            dp_rank=rank,
        )

    @property
    def dp_rank(self) -> int:
        return self._dp_rank

    @property
    def batches(self) -> int:
        return self._sequence

    def attach(self, hub: KvEventHub) -> None:
        """Publish every batch of this rank that the engine's gRPC hub publishes, after it (same order,
        same numbers: both count from the rank's first batch)."""
        hub.add_listener(self.publish, self._dp_rank)

    def restart(self) -> None:
        """A new process: batches numbered from 0 again, and no history to replay (the sockets stay bound;
        a subscriber tells the restart by the sequence going back)."""
        self._sequence = 0
        self._buffer.clear()

    def publish(self, events: list[KvEvent]) -> None:
        sequence = self._sequence
        self._sequence += 1
        try:
            payload = encode_batch(time.time(), events, self._dp_rank)
            # A PUB socket never blocks: a subscriber past its high-water mark loses messages (as in vLLM).
            self._pub.send_multipart((self._topic, sequence.to_bytes(8, "big"), payload))
        except Exception:  # the channel is a side output: the engine steps on without it
            logger.exception("KV event batch %d not published over ZMQ", sequence)
            return
        self._buffer.append((sequence, payload))

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        replay = self._replay
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3:
                logger.warning("ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            try:
                await self._replay_from(replay, client, int.from_bytes(start, "big"))
            except zmq.ZMQError:
                logger.exception("KV event replay to a client failed")

    async def _replay_from(self, replay: zmq.asyncio.Socket, client: bytes, first: int) -> None:
        sent = 0
        for sequence, payload in list(self._buffer):  # a snapshot: steps go on publishing meanwhile
            if sequence >= first:
                await replay.send_multipart((client, b"", self._topic, sequence.to_bytes(8, "big"), payload))
                sent += 1
                if sent % REPLAY_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        await replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        self._close_sockets()
