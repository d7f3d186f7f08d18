"""The pieces under the front-end / engine-core split: the slab's ring allocator, the slab's
tensors as both processes see them, and the channel's framing."""

from __future__ import annotations

import asyncio
import os
import pickle
import random
import socket

import ml_dtypes
import numpy as np
import pytest
from wattserve.server.split import channel
from wattserve.server.split.core_client import CoreClient, _Pending
from wattserve.server.split.slab import ALIGN, RingAllocator, Slab, pack


def test_ring_hands_out_disjoint_blocks_and_refuses_when_full():
    ring = RingAllocator(1024)
    blocks = [ring.allocate(200) for _ in range(4)]  # 4 x 256 (aligned) fills it
    assert blocks == [0, 256, 512, 768]
    assert ring.allocate(1) is None
    ring.free(256)  # not the oldest: nothing comes back yet
    assert ring.allocate(1) is None
    ring.free(0)  # the oldest: both are back, at the front
    assert ring.allocate(512) == 0  # wrapped: the end (768..1024) is still taken
    assert ring.allocate(64) is None


def test_ring_wraps_and_counts_the_skipped_end():
    ring = RingAllocator(1000)
    a = ring.allocate(600)
    b = ring.allocate(300)
    assert (a, b) == (0, 640)
    ring.free(a)
    c = ring.allocate(500)  # does not fit before the end (960..1000): starts again at 0
    assert c == 0
    ring.free(b)
    ring.free(c)
    assert ring.used == 0 and ring.live == 0


def test_ring_random_frees_never_overlap_live_blocks():
    """Random sizes, frees in random order: no two live blocks ever overlap and every block
    lies inside the ring."""
    rng = random.Random(7)
    size = 64 * 1024
    ring = RingAllocator(size)
    live: dict[int, int] = {}
    for _ in range(5000):
        if live and (rng.random() < 0.45 or ring.used > size * 0.9):
            start = rng.choice(list(live))
            ring.free(start)
            del live[start]
            continue
        n = rng.randint(1, 8000)
        start = ring.allocate(n)
        if start is None:
            continue
        end = start + n
        assert start >= 0 and end <= size and start % ALIGN == 0
        for other, other_n in live.items():
            assert end <= other or other + other_n <= start, "overlapping blocks"
        live[start] = n
    for start in list(live):
        ring.free(start)
    assert ring.used == 0


def test_slab_shared_through_its_descriptor():
    """What the front end writes, the core reads through its own mapping of the same fd."""
    slab = Slab.create(1 << 20)
    other = Slab(os.dup(slab.fd), slab.size)
    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([[1, 2]], dtype=np.int64),
        "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C order: copied as C order
        "sliced": np.arange(40, dtype=np.float64).reshape(8, 5)[2:4],  # a batch's rows
        "empty": np.zeros((0, 4), np.float32),
        "bf16": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "bool": np.array([True, False, True]),
    }
    refs, end = pack(arrays, 128)
    for (_, _, _, offset, _), value in zip(refs, arrays.values(), strict=True):
        slab.write(offset, value)
    for name, dtype, shape, offset, _ in refs:
        np.testing.assert_array_equal(other.array(dtype, shape, offset), arrays[name])
        assert other.array(dtype, shape, offset).dtype == arrays[name].dtype
    assert end > 128 and all(offset % ALIGN == 0 for *_, offset, _ in refs)
    other.close()
    slab.close()


async def test_frames_arrive_whole_and_in_order_in_any_split():
    """Frames cut at every byte boundary by the transport reassemble into the same headers
    and raw bytes."""
    got: list[tuple[object, bytes]] = []
    protocol = channel.FrameProtocol(lambda header, raw: got.append((header, bytes(raw))), lambda exc: None)
    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    writer = channel.FrameProtocol(lambda h, r: None, lambda exc: None)
    await loop.create_unix_connection(lambda: writer, sock=left)
    frames = [((channel.INFER, i, "m", list(range(i))), bytes([i]) * i) for i in range(20)]
    for header, raw in frames:
        writer.send(header, [raw] if raw else [])
    await asyncio.sleep(0)  # the coalesced write leaves
    await asyncio.sleep(0.05)
    data = right.recv(1 << 20)
    for i in range(len(data)):  # one byte at a time
        protocol.data_received(data[i : i + 1])
    assert got == [(h, r) for h, r in frames]
    writer.close()
    right.close()


async def test_a_turns_frames_without_raw_bytes_travel_as_one_frame_in_order():
    """Headers queued in one turn leave as one MANY frame between the frames that carry raw
    bytes, and arrive one by one in the order they were queued."""
    got: list[tuple[object, bytes]] = []
    reader = channel.FrameProtocol(lambda header, raw: got.append((header, bytes(raw))), lambda exc: None)
    left, right = socket.socketpair()
    writer = channel.FrameProtocol(lambda h, r: None, lambda exc: None)
    await asyncio.get_running_loop().create_unix_connection(lambda: writer, sock=left)
    frames = [((channel.ANSWER, i, True, ("m", [i] * (i % 3))), b"raw%d" % i if i % 5 == 4 else b"")
              for i in range(12)]  # fmt: skip
    for header, raw in frames:
        writer.send(header, [raw] if raw else [])
    await asyncio.sleep(0.05)  # the turn's one write leaves
    data = right.recv(1 << 20)
    prefixes = []
    at = 0
    while at < len(data):  # the frames on the wire: 0-3 plain, 4 raw, 5-8, 9 raw, 10-11
        header_length, raw_length = channel.PREFIX.unpack_from(data, at)
        header = pickle.loads(data[at + 8 : at + 8 + header_length])
        prefixes.append(header[0] if header[0] == channel.MANY else header[1])
        at += 8 + header_length + raw_length
    assert prefixes == [channel.MANY, 4, channel.MANY, 9, channel.MANY]
    reader.data_received(data)
    assert got == frames
    writer.close()
    right.close()


def test_a_frame_that_cannot_be_encoded_costs_only_itself(caplog):
    """One header pickle refuses (a caller's bug) is dropped and logged; the turn's other
    frames still leave."""
    sent: list[bytes] = []

    class Transport:
        def writelines(self, parts):
            sent.append(b"".join(bytes(p) for p in parts))

    writer = channel.FrameProtocol(lambda h, r: None, lambda exc: None)
    writer.transport = Transport()  # type: ignore[assignment]
    writer._loop = asyncio.new_event_loop()
    try:
        writer.send((channel.ANSWER, 1, True, None))
        writer.send((channel.ANSWER, 2, True, lambda: None))  # a lambda does not pickle
        writer.send((channel.ANSWER, 3, True, None))
        writer._flush()
    finally:
        writer._loop.close()
    got: list[object] = []
    reader = channel.FrameProtocol(lambda header, raw: got.append(header), lambda exc: None)
    reader.data_received(sent[0])
    assert [h[1] for h in got] == [1, 3]
    assert "unencodable" in caplog.text


def test_a_corrupt_length_fails_the_connection():
    protocol = channel.FrameProtocol(lambda h, r: None, lambda exc: None)
    with pytest.raises(ValueError, match="frame header"):
        protocol.data_received(channel.PREFIX.pack(channel.MAX_HEADER + 1, 0))


def test_a_child_gets_only_the_settings_that_were_set(tmp_path):
    """A default must stay a default in the core: a repository model keeps Triton's queue
    semantics unless the user set wattserve's bound (max_queue_wait_s), and the core tells
    the two apart by what was set."""
    import json

    from wattserve.server.settings import Settings
    from wattserve.server.split.processes import ENV_SETTINGS
    from wattserve.server.split.supervisor import child_env

    settings = Settings(model="identity").model_copy(update={"port": 18000, "frontend_workers": 2})
    sent = json.loads(child_env(settings, tmp_path, "core", 0)[ENV_SETTINGS])
    assert sent == {"model": "identity", "port": 18000, "frontend_workers": 2}
    child = Settings(**sent)
    assert "max_queue_wait_s" not in child.model_fields_set
    assert child.max_queue_wait_s == settings.max_queue_wait_s


def test_a_large_frame_in_many_reads_is_parsed_once_when_whole():
    """A 4 MiB inline tensor arriving 64 KiB at a time: nothing is parsed (or copied out of
    the read buffer) until the frame is complete; then it arrives once, byte for byte."""
    got: list[tuple[object, bytes]] = []
    protocol = channel.FrameProtocol(lambda header, raw: got.append((header, bytes(raw))), lambda exc: None)
    raw = bytes(range(256)) * (4 * 4096)
    header = pickle.dumps((channel.ANSWER, 1, True, None))
    frame = channel.PREFIX.pack(len(header), len(raw)) + header + raw
    chunk = 64 * 1024
    for at in range(0, len(frame) - chunk, chunk):
        protocol.data_received(frame[at : at + chunk])
        assert not got and protocol._needed == len(frame)  # waits for the whole frame
    protocol.data_received(frame[at + chunk :])
    assert got == [((channel.ANSWER, 1, True, None), raw)]


async def test_answer_blocks_are_freed_only_after_every_waiter_of_the_read_has_run():
    """A read's answers are views of their slab blocks, encoded by each waiter when it wakes:
    no block of the read may go back to the ring (and be handed to a new request) before
    the last of those waiters has run."""
    client = CoreClient("/nonexistent", 1 << 20)
    loop = asyncio.get_running_loop()
    blocks = [client.ring.allocate(256) for _ in range(3)]
    futures = [loop.create_future() for _ in blocks]
    for i, (block, future) in enumerate(zip(blocks, futures, strict=True)):
        client._pending[i] = _Pending(future, block)
    held: list[bool] = []

    async def waiter(i: int) -> None:
        await futures[i]
        held.append(blocks[i] in client.ring._blocks)  # still its own while it encodes

    tasks = [loop.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    for i, block in enumerate(blocks):
        payload = ([("OUTPUT0", "<f4", (1, 4), block, 16)], (0.0, 0.0, 1, 0.0, 0.0))
        client._on_frame((channel.ANSWER, i, True, payload), channel.EMPTY)
    client._on_read()
    await asyncio.gather(*tasks)
    assert held == [True, True, True]
    await asyncio.sleep(0)
    assert client.ring.used == 0  # and every one of them freed after
    client.slab.close()
