"""The simulator's vLLM-style ZMQ KV-event channel, read with real ZMQ sockets and decoded by vLLM's own code.

Each engine publishes on a PUB socket (ipc:// here) what SubscribeKvEvents streams over gRPC; the payloads
are handed to vLLM's msgspec `KVEventBatch` decoder in the vLLM venv (load/vllm_engine builds it once, a
cached 6 GB venv), which must decode them and re-encode them to the same bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from extproc.models import default_model_dir
from extproc.simulator import SimCluster, SimOptions, start_engines
from extproc.simulator.__main__ import parse_args
from extproc.simulator.cluster import SimEngine
from extproc.simulator.kv_cache import Stored
from extproc.simulator.zmq_publisher import END_SEQ, encode_batch, endpoint_for

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "kv-events"
BLOCK = 16
# Small and fast: 5 blocks of 16 tokens, so a second prompt evicts the first one's blocks.
OPTIONS = SimOptions(ttft_ms=0.5, itl_ms=0.2, block_size=BLOCK, num_blocks=5)
# Two prompts sharing no block: 40 tokens each, 3 full blocks once 20 tokens are generated.
PROMPT_A = [128000, *range(1000, 1039)]
PROMPT_B = [128000, *range(2000, 2039)]
U64 = (1 << 64) - 1


def signed(value: int) -> int:
    """An unsigned 64-bit hash as the int64 KvBlock.block_hash carries it."""
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass
class Batch:
    sequence: int
    events: list[
        tuple[Any, ...]
    ]  # ("stored", hashes, parent, tokens, size) | ("removed", hash) | ("cleared",)
    timestamp: float


def zmq_batch(frames: list[bytes]) -> Batch:
    _, sequence, payload = frames
    ts, events, dp_rank = msgpack.unpackb(payload)
    assert dp_rank == 0
    normalized: list[tuple[Any, ...]] = []
    for event in events:
        if event["type"] == "BlockStored":
            parent = event["parent_block_hash"]
            normalized.append(
                (
                    "stored",
                    [signed(h) for h in event["block_hashes"]],
                    None if parent is None else signed(parent),
                    event["token_ids"],
                    event["block_size"],
                )
            )
        elif event["type"] == "BlockRemoved":
            normalized.extend(("removed", signed(h)) for h in event["block_hashes"])
        else:
            assert event == {"type": "AllBlocksCleared"}
            normalized.append(("cleared",))
    return Batch(int.from_bytes(sequence, "big"), normalized, ts)


def grpc_batch(batch: common_pb2.KvEventBatch) -> Batch:
    normalized: list[tuple[Any, ...]] = []
    for event in batch.events:
        kind = event.WhichOneof("data")
        if kind == "stored":
            blocks = event.stored.blocks
            parent = event.stored.parent_block_hash if event.stored.HasField("parent_block_hash") else None
            tokens = [t for b in blocks for t in b.token_ids]
            normalized.append(
                ("stored", [b.block_hash for b in blocks], parent, tokens, blocks[0].block_size)
            )
        elif kind == "removed":
            normalized.extend(("removed", h) for h in event.removed.block_hashes)
        else:
            normalized.append(("cleared",))
    return Batch(batch.sequence_number, normalized, batch.timestamp)


@dataclass
class Subscribers:
    """One engine watched over both channels: a ZMQ SUB socket and a SubscribeKvEvents stream."""

    engine: SimEngine
    stub: pb_grpc.VllmEngineStub
    sub: zmq.asyncio.Socket
    frames: list[list[bytes]] = field(default_factory=list)
    grpc_batches: list[Batch] = field(default_factory=list)

    @property
    def zmq_batches(self) -> list[Batch]:
        return [zmq_batch(f) for f in self.frames]

    async def read_zmq(self, wait_s: float = 0.1) -> int:
        """Take what the SUB socket has within `wait_s`; how many messages came."""
        count = 0
        while await self.sub.poll(wait_s * 1000):
            self.frames.append(await self.sub.recv_multipart())
            count += 1
            wait_s = 0.01
        return count

    async def settle(self) -> None:
        """Until both channels have every batch the engine published so far."""
        deadline = time.monotonic() + 5
        while True:
            await self.read_zmq()
            published = self.engine.core.hub.batches
            got_zmq = bool(self.frames) and zmq_batch(self.frames[-1]).sequence == published - 1
            got_grpc = bool(self.grpc_batches) and self.grpc_batches[-1].sequence == published - 1
            if got_zmq and got_grpc:
                return
            assert time.monotonic() < deadline, (published, len(self.frames), len(self.grpc_batches))


async def subscribe(engine: SimEngine) -> AsyncIterator[Subscribers]:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        await call.initial_metadata()  # the hub has registered this stream
        sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        assert engine.kv_publisher is not None
        sub.connect(engine.kv_publisher.endpoint)
        watched = Subscribers(engine, stub, sub)

        async def read_grpc() -> None:
            try:
                async for batch in call:
                    if not batch.load.load_only:
                        watched.grpc_batches.append(grpc_batch(batch))
            except grpc.aio.AioRpcError:
                pass  # the engine restarted: the ZMQ channel alone goes on

        reader = asyncio.create_task(read_grpc())
        try:
            # A SUB socket hears nothing until its subscription reached the publisher (ZMQ's slow joiner):
            # flush the idle cache (a Cleared batch each time) until one arrives.
            deadline = time.monotonic() + 10
            while not await watched.read_zmq():
                assert time.monotonic() < deadline, "the SUB socket never received a batch"
                await stub.FlushCache(common_pb2.FlushCacheRequest())
            await watched.settle()
            yield watched
        finally:
            reader.cancel()
            call.cancel()
            sub.close(linger=0)


def ipc_options(tmp_path: Path, **overrides: Any) -> SimOptions:
    settings: dict[str, Any] = {
        "kv_events_zmq": f"ipc://{tmp_path}/kv-{{i}}.ipc",
        "kv_events_zmq_replay": f"ipc://{tmp_path}/kv-replay-{{i}}.ipc",
        "kv_events_zmq_topic": TOPIC,
        **overrides,
    }
    return replace(OPTIONS, **settings)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SimCluster]:
    sim = await start_engines(default_model_dir(), count=2, base_port=0, options=ipc_options(tmp_path))
    yield sim
    await sim.stop(grace=None)


@pytest.fixture
async def watched(cluster: SimCluster) -> AsyncIterator[Subscribers]:
    async for subscribers in subscribe(cluster.engines[0]):
        yield subscribers


async def generate(stub: pb_grpc.VllmEngineStub, prompt: list[int], max_tokens: int = 20) -> list[int]:
    """Prompt plus generated tokens."""
    request = pb.GenerateRequest(
        request_id=f"r{prompt[1]}",
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    responses = [r async for r in stub.Generate(request)]
    return prompt + list(responses[-1].complete.output_ids)


def stored_events(batches: list[Batch]) -> list[tuple[Any, ...]]:
    return [e for b in batches for e in b.events if e[0] == "stored"]


async def test_stored_blocks_arrive_as_vllm_publishes_them(watched: Subscribers) -> None:
    start = len(watched.frames)
    tokens = await generate(watched.stub, PROMPT_A)
    await watched.settle()
    frames = watched.frames[start:]
    assert frames and all(f[0] == TOPIC.encode() for f in frames)
    stored = stored_events([zmq_batch(f) for f in frames])
    # The prompt's 2 full blocks at once, then the third as decoding fills it, chained to the second.
    hashes = watched.engine.core.scheduler.cache.chain_hashes(tokens[: 3 * BLOCK])
    assert stored == [
        ("stored", hashes[:2], None, tokens[: 2 * BLOCK], BLOCK),
        ("stored", hashes[2:3], hashes[1], tokens[2 * BLOCK : 3 * BLOCK], BLOCK),
    ]
    # On the wire the hashes are vLLM's unsigned 64-bit integers.
    raw = msgpack.unpackb(frames[-1][2])[1][-1]
    assert raw["block_hashes"] == [hashes[2] & U64] and raw["parent_block_hash"] == hashes[1] & U64


async def test_zmq_batches_match_subscribe_kv_events(watched: Subscribers) -> None:
    await generate(watched.stub, PROMPT_A)
    await generate(watched.stub, PROMPT_B)  # evicts blocks of A: the cache holds 5
    await watched.stub.FlushCache(common_pb2.FlushCacheRequest())
    await watched.settle()
    live = watched.zmq_batches
    sequences = [b.sequence for b in live]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    by_sequence = {b.sequence: b for b in watched.grpc_batches}
    for batch in live:
        assert batch.events == by_sequence[batch.sequence].events, batch.sequence
        assert abs(batch.timestamp - by_sequence[batch.sequence].timestamp) < 1.0
    kinds = {e[0] for b in live for e in b.events}
    assert kinds == {"stored", "removed", "cleared"}
    # Every evicted hash was stored before.
    stored = {h for e in stored_events(live) for h in e[1]}
    assert {e[1] for b in live for e in b.events if e[0] == "removed"} <= stored


async def test_each_engine_publishes_on_its_own_endpoint(cluster: SimCluster, tmp_path: Path) -> None:
    first, second = cluster.engines
    assert first.kv_publisher is not None and second.kv_publisher is not None
    assert first.kv_publisher.endpoint == f"ipc://{tmp_path}/kv-0.ipc"
    assert second.kv_publisher.endpoint == f"ipc://{tmp_path}/kv-1.ipc"
    async for watched in subscribe(second):
        before = first.kv_publisher.batches
        tokens = await generate(watched.stub, PROMPT_B)
        await watched.settle()
        assert stored_events(watched.zmq_batches)[0][3] == tokens[: 2 * BLOCK]
        assert first.kv_publisher.batches == before  # engine 0 published nothing meanwhile


async def replay(endpoint: str, start: int) -> list[list[bytes]]:
    """vLLM's replay protocol from a DEALER: the batches from `start` on, up to the end marker."""
    dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        await dealer.send_multipart((b"", start.to_bytes(8, "big")))
        frames = []
        while True:
            assert await dealer.poll(5000), "no end marker from the replay socket"
            message = await dealer.recv_multipart()
            assert message[0] == b""
            if message[2] == END_SEQ:
                assert message == [b"", b"", END_SEQ, b""]
                return frames
            frames.append(message[1:])
    finally:
        dealer.close(linger=0)


async def test_replay_resends_missed_batches(watched: Subscribers) -> None:
    await generate(watched.stub, PROMPT_A)
    await watched.settle()
    publisher = watched.engine.kv_publisher
    assert publisher is not None and publisher.replay_endpoint is not None
    # A consumer that joined late (or lost messages) asks from sequence 1 and gets the same messages.
    replayed = await replay(publisher.replay_endpoint, 1)
    assert [zmq_batch(f).sequence for f in replayed] == list(range(1, publisher.batches))
    live = {zmq_batch(f).sequence: f for f in watched.frames}
    assert all(live[zmq_batch(f).sequence] == f for f in replayed if zmq_batch(f).sequence in live)
    assert await replay(publisher.replay_endpoint, publisher.batches) == []  # nothing newer yet


async def test_a_restarted_engine_numbers_its_batches_from_zero(watched: Subscribers) -> None:
    await generate(watched.stub, PROMPT_A)
    await watched.settle()
    publisher = watched.engine.kv_publisher
    assert publisher is not None and publisher.replay_endpoint is not None
    before = len(watched.frames)
    assert zmq_batch(watched.frames[-1]).sequence > 0
    await watched.engine.restart(down_s=0)
    async with grpc.aio.insecure_channel(watched.engine.address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        await stub.HealthCheck(pb.HealthCheckRequest(), timeout=10, wait_for_ready=True)
        tokens = await generate(stub, PROMPT_A)
    deadline = time.monotonic() + 5
    while len(watched.frames) == before:
        assert time.monotonic() < deadline, "no batch after the restart"
        await watched.read_zmq()
    # The same socket, sequences from 0, no clearing announced; the prompt is stored anew, as a
    # subscriber that missed the restart must see to know that its index is stale.
    after = [zmq_batch(f) for f in watched.frames[before:]]
    assert after[0].sequence == 0 and after[0].events[0][:4] == (
        "stored",
        watched.engine.core.scheduler.cache.chain_hashes(tokens[: 2 * BLOCK]),
        None,
        tokens[: 2 * BLOCK],
    )
    # The replay socket keeps nothing from before the restart.
    replayed = await replay(publisher.replay_endpoint, 0)
    assert [zmq_batch(f).sequence for f in replayed] == list(range(publisher.batches))


# A batch a real vLLM 0.32 engine (CPU, the tiny Llama of load/vllm_engine, 128-token blocks) published on
# its ZMQ socket: the block its decoding filled after a 301-token prompt (tokens 1255-1299, then its
# greedy repeats of 1299).
VLLM_PAYLOAD = bytes.fromhex(
    "93cb41dac33bb3595e3d918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfaa0254a6"
    "35239545b1706172656e745f626c6f636b5f68617368cf4eda0804df5f246ea9746f6b656e5f696473dc0080cd04e7cd"
    "04e8cd04e9cd04eacd04ebcd04eccd04edcd04eecd04efcd04f0cd04f1cd04f2cd04f3cd04f4cd04f5cd04f6cd04f7cd"
    "04f8cd04f9cd04facd04fbcd04fccd04fdcd04fecd04ffcd0500cd0501cd0502cd0503cd0504cd0505cd0506cd0507cd"
    "0508cd0509cd050acd050bcd050ccd050dcd050ecd050fcd0510cd0511cd0512cd0513cd0513cd0513cd0513cd0513cd"
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd"
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd"
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd"
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd"
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513aa626c6f"
    "636b5f73697a65cc80a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b"
    "65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e7469"
    "6f6e00"
)


def test_payload_matches_one_captured_from_vllm() -> None:
    ts, (event,), dp_rank = msgpack.unpackb(VLLM_PAYLOAD)
    assert dp_rank == 0 and event["block_size"] == 128
    stored = Stored(
        block_hashes=tuple(signed(h) for h in event["block_hashes"]),
        parent_hash=signed(event["parent_block_hash"]),
        token_ids=tuple(event["token_ids"]),
        block_size=128,
    )
    assert encode_batch(ts, [stored]) == VLLM_PAYLOAD


# Run by the vLLM venv's python: decode each payload with vLLM's own decoder, re-encode it with vLLM's
# encoder (the bytes must be identical), and print the decoded events.
VLLM_DECODE = """
import json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch
decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
encoder = msgspec.msgpack.Encoder()
out = []
for text in json.load(open(sys.argv[1])):
    raw = bytes.fromhex(text)
    batch = decoder.decode(raw)
    out.append({
        "same_bytes": encoder.encode(batch) == raw,
        "ts": batch.ts,
        "dp_rank": batch.data_parallel_rank,
        "events": [{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in batch.events],
    })
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    from load.vllm_engine.venv import ensure_venv

    return ensure_venv()  # cached; built (minutes, from PyPI) where it is missing


async def test_vllm_decodes_the_payloads(watched: Subscribers, vllm_python: Path, tmp_path: Path) -> None:
    start = len(watched.frames)
    tokens = await generate(watched.stub, PROMPT_A)
    await generate(watched.stub, PROMPT_B)
    await watched.stub.FlushCache(common_pb2.FlushCacheRequest())
    await watched.settle()
    frames = watched.frames[start:]
    dump = tmp_path / "payloads.json"
    dump.write_text(json.dumps([f[2].hex() for f in frames]))
    process = await asyncio.create_subprocess_exec(
        str(vllm_python), "-c", VLLM_DECODE, str(dump), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, err.decode()[-3000:]
    decoded = json.loads(out)
    assert len(decoded) == len(frames)
    assert [(b["same_bytes"], b["dp_rank"]) for b in decoded] == [(True, 0)] * len(decoded)
    assert [b["ts"] for b in decoded] == [zmq_batch(f).timestamp for f in frames]
    events = [e for b in decoded for e in b["events"]]
    hashes = watched.engine.core.scheduler.cache.chain_hashes(tokens[: 2 * BLOCK])
    assert events[0] == {
        "type": "BlockStored",
        "block_hashes": [h & U64 for h in hashes],
        "parent_block_hash": None,
        "token_ids": tokens[: 2 * BLOCK],
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
        "locality": None,
        "ownership": None,
        "session_id": None,
    }
    # One BlockRemoved per evicted block, as vLLM's block pool sends them.
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    assert removed
    for event in removed:
        assert len(event.pop("block_hashes")) == 1
        assert event == {
            "type": "BlockRemoved",
            "medium": "GPU",
            "group_idx": 0,
            "locality": None,
            "ownership": None,
        }
    assert events[-1] == {"type": "AllBlocksCleared"}


def test_endpoints_per_engine() -> None:
    assert endpoint_for("tcp://*:5557", 0, 4) == "tcp://*:5557"
    assert endpoint_for("tcp://*:5557", 3, 4) == "tcp://*:5560"  # vLLM's data-parallel offset
    assert endpoint_for("tcp://*:0", 3, 4) == "tcp://*:0"  # a free port each
    assert endpoint_for("ipc:///tmp/kv-{i}.ipc", 2, 4) == "ipc:///tmp/kv-2.ipc"
    assert endpoint_for("ipc:///tmp/kv.ipc", 0, 1) == "ipc:///tmp/kv.ipc"
    with pytest.raises(ValueError, match="need"):
        endpoint_for("ipc:///tmp/kv.ipc", 0, 2)
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--engines", "2", "--kv-events-zmq", "ipc:///tmp/kv.ipc"])
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--kv-events-zmq", "http://localhost:1"])


async def test_tcp_wildcard_binds_a_free_port_per_engine() -> None:
    options = replace(OPTIONS, kv_events_zmq="tcp://*:0")
    sim = await start_engines(default_model_dir(), count=2, base_port=0, options=options)
    try:
        endpoints = [e.kv_publisher.endpoint for e in sim.engines if e.kv_publisher is not None]
        assert len(endpoints) == 2 and len(set(endpoints)) == 2
        assert all(re.fullmatch(r"tcp://0\.0\.0\.0:\d+", e) for e in endpoints)
    finally:
        await sim.stop(grace=None)


async def test_tcp_host_endpoint_connects_to_a_binding_consumer() -> None:
    """As in vLLM, tcp://host:port (no wildcard) makes the publisher connect: the consumer binds."""
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    options = replace(OPTIONS, kv_events_zmq=f"tcp://127.0.0.1:{port}", kv_events_zmq_topic=TOPIC)
    sim = await start_engines(default_model_dir(), count=1, base_port=0, options=options)
    try:
        async with grpc.aio.insecure_channel(sim.addresses[0]) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            deadline = time.monotonic() + 10
            while not await sub.poll(100):
                assert time.monotonic() < deadline, "nothing arrived at the binding consumer"
                await stub.FlushCache(common_pb2.FlushCacheRequest())
        topic, _, payload = await sub.recv_multipart()
        assert topic == TOPIC.encode() and msgpack.unpackb(payload)[1] == [{"type": "AllBlocksCleared"}]
    finally:
        await sim.stop(grace=None)
        sub.close(linger=0)


def read_lines(stream: Any, count: int, timeout: float = 30) -> Iterator[str]:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(stream.readline()) for _ in range(count)], daemon=True).start()
    for _ in range(count):
        yield lines.get(timeout=timeout)


def test_cli_publishes_per_engine(tmp_path: Path) -> None:
    command = [
        *(sys.executable, "-m", "extproc.simulator", "--port", "0", "--engines", "2"),
        *("--kv-events-zmq", f"ipc://{tmp_path}/kv-{{i}}.ipc", "--kv-events-zmq-topic", TOPIC),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None
            addresses = []
            for i, line in enumerate(read_lines(process.stdout, 2)):
                kv = re.escape(f"(kv events on ipc://{tmp_path}/kv-{i}.ipc)")
                match = re.fullmatch(rf"engine {i} listening on (127\.0\.0\.1:\d+) {kv}\n", line)
                assert match, line
                addresses.append(match.group(1))
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"ipc://{tmp_path}/kv-1.ipc")
            with grpc.insecure_channel(addresses[1]) as channel:
                stub = pb_grpc.VllmEngineStub(channel)
                deadline = time.monotonic() + 10
                while not sub.poll(100):  # until the subscription is live
                    assert time.monotonic() < deadline
                    stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5)
                while sub.poll(50):
                    sub.recv_multipart()
                request = pb.GenerateRequest(
                    request_id="cli",
                    tokenized=pb.TokenizedInput(input_ids=PROMPT_A),
                    sampling_params=pb.SamplingParams(max_tokens=2, ignore_eos=True),
                )
                list(stub.Generate(request, timeout=5))
            assert sub.poll(5000)
            topic, _, payload = sub.recv_multipart()
            sub.close(linger=0)
            assert topic == TOPIC.encode()
            event = msgpack.unpackb(payload)[1][0]
            assert event["type"] == "BlockStored" and event["token_ids"] == PROMPT_A[: 2 * BLOCK]
            process.terminate()
            _, errors = process.communicate(timeout=10)
            assert process.returncode == 0, errors
        finally:
            if process.poll() is None:
                process.kill()


def test_simulator_runs_without_zmq_when_off() -> None:
    """pyzmq and msgpack are optional: a cluster without the channel never imports them."""
    script = (
        "import asyncio, sys\n"
        "from extproc.models import default_model_dir\n"
        "from extproc.simulator import start_engines\n"
        "async def main():\n"
        "    sim = await start_engines(default_model_dir(), count=1, base_port=0)\n"
        "    await sim.stop(grace=None)\n"
        "asyncio.run(main())\n"
        "assert 'zmq' not in sys.modules and 'msgpack' not in sys.modules, 'imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
