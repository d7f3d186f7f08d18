"""A front end's side of the channel: the engine core as a set of remote model runtimes.

``CoreClient`` owns the connection and the slab: a request's tensors are written into a
block of the slab (with room for its answer when the model's output shapes are fixed) and
its header sent; the core's answer resolves the request's future. ``RemoteRuntime`` gives
the admission path (``server.core.admission.admit``) what a local ``ModelRuntime`` gives it
(specs to decode against, ``make_item``, ``infer``, ``cancel``, outcome counters), so the
front end decodes, validates and encodes with the same code as a single-process server.

When the core goes away every request in flight is answered UNAVAILABLE (it may have been
computed, but its answer is lost with the core) and the client reconnects in the
background; meanwhile the front end answers 503 and reports not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from wattserve.batchers.status import Status
from wattserve.batchers.types import RequestError, Result
from wattserve.engines.base import TensorSpec
from wattserve.server.core.request import InferRequest
from wattserve.server.models.metrics import request_protocol
from wattserve.server.split import channel
from wattserve.server.split.core_service import ModelInfo
from wattserve.server.split.slab import RingAllocator, Slab, dtype_of, inline, pack

log = logging.getLogger("wattserve.frontend")

NEGATIVE_TTL_S = 1.0  # a model the core would not describe is asked about again after this


class CoreUnavailable(RequestError):
    """The engine core is not connected (restarting): retry shortly."""

    status = Status.UNAVAILABLE
    outcome = "error"
    retry_after = True


class StaleModel(Exception):
    """The core reloaded the model since this front end described it: describe it again."""


class RemoteError(RequestError):
    """The core's refusal or failure, with its status kind."""

    def __init__(self, status: str, message: str, retry_after: bool) -> None:
        super().__init__(message)
        self.status = Status(status)
        self.retry_after = retry_after


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Any]
    block: int | None  # the slab block holding the request and its answer (freed on answer)
    infer: bool = True  # an inference's answer (else a description)


class CoreClient:
    """One connection to the core, reconnecting while the front end lives."""

    def __init__(self, path: str, slab_bytes: int, index: int = 0) -> None:
        self.path = path
        self.index = index  # this front end's number (1..N), for the core's per-front-end count
        self.slab = Slab.create(slab_bytes, "wattserve-frontend")
        self.ring = RingAllocator(slab_bytes)
        self.protocol: channel.FrameProtocol | None = None
        self.connected = asyncio.Event()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._catalog: dict[tuple[str, str | None], ModelInfo | float] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._idle: asyncio.Future[None] | None = None
        self._answered_blocks: list[int] = []  # freed together once their answers are encoded
        self.draining = False  # SIGTERM: new inferences are refused (503), those in flight answered

    @property
    def inflight(self) -> int:
        return len(self._pending)

    async def idle(self) -> None:
        """Return once nothing is in flight (a drain's wait)."""
        while self._pending:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    # ------------------------------------------------------------------ connection
    def start(self) -> None:
        """Connect, and reconnect whenever the core goes away (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._stay_connected(), name="core-client")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.protocol is not None:
            self.protocol.close()

    async def _stay_connected(self) -> None:
        delay = 0.05
        while not self._closing:
            try:
                await self._connect()
                delay = 0.05
                assert self.protocol is not None
                await self._lost.wait()
            except OSError as exc:
                log.debug("core not reachable (%s); retrying in %.2fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5.0)

            def handshake() -> None:
                sock.connect(self.path)
                hello = pickle.dumps({"pid": os.getpid(), "index": self.index, "slab_bytes": self.slab.size})
                socket.send_fds(sock, [hello], [self.slab.fd])
                pickle.loads(sock.recv(4096))

            await asyncio.to_thread(handshake)
            sock.setblocking(False)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            sock.close()
            raise OSError(f"handshake: {exc}") from exc
        self._lost = asyncio.Event()
        protocol = channel.FrameProtocol(self._on_frame, self._on_lost, self._on_read)
        await loop.create_unix_connection(lambda: protocol, sock=sock)
        self.protocol = protocol
        self._catalog.clear()  # a new core: every model described again
        self.connected.set()
        log.info("connected to the engine core")

    def _on_lost(self, exc: BaseException | None) -> None:
        self.connected.clear()
        self.protocol = None
        pending, self._pending = self._pending, {}
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        for entry in pending.values():
            if entry.block is not None:
                self.ring.free(entry.block)
            if not entry.future.done():
                entry.future.set_exception(CoreUnavailable("the engine core went away; retry"))
        if not self._closing:
            log.warning("lost the engine core; %d request(s) answered 503", len(pending))
        self._lost.set()

    # ------------------------------------------------------------------ frames
    def _on_frame(self, header: Any, raw: memoryview) -> None:
        if header[0] != channel.ANSWER:
            return
        _, request_id, ok, payload = header
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return
        if not self._pending and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        block, future = entry.block, entry.future
        if not ok:
            status, message, retry_after = payload
            if block is not None:
                self.ring.free(block)
            if not future.done():
                stale = status == "STALE"  # not a Status: the core's word for a reloaded model
                future.set_exception(
                    StaleModel(message) if stale else RemoteError(status, message, retry_after)
                )
            return
        if not entry.infer:  # a description
            if not future.done():
                future.set_result(payload)
            return
        if future.done():  # its waiter left (cancelled): nobody reads the answer
            if block is not None:
                self.ring.free(block)
            return
        try:
            result = self._answer(payload, raw)
        except BaseException:
            if block is not None:
                self.ring.free(block)
            raise
        future.set_result(result)
        if block is not None:
            # The answer's tensors are views of the block, read by the encoder in the step this
            # wakes (the awaiting task resumes, encodes and copies into the response body with
            # no await between: HTTP's infer route and gRPC's ModelInfer both); the block is
            # reused only after that step: the blocks answered in one read are freed by one
            # call_soon queued after the read (_on_read), so after every wake-up it queued.
            self._answered_blocks.append(block)

    def _on_read(self) -> None:
        if self._answered_blocks:
            blocks, self._answered_blocks = self._answered_blocks, []
            asyncio.get_running_loop().call_soon(self._free_blocks, blocks)

    def _free_blocks(self, blocks: list[int]) -> None:
        free = self.ring.free
        for block in blocks:
            free(block)

    def _answer(self, payload: Any, raw: memoryview) -> Result:
        """The answer's tensors as views (no copy): of the slab block, or of the frame's raw
        section (immutable bytes that the views keep alive)."""
        refs, (queue_s, compute_s, batch_size, input_s, output_s) = payload
        outputs: dict[str, np.ndarray] = {}
        for name, dtype, shape, offset, nbytes in refs:
            if offset >= 0:
                outputs[name] = self.slab.array(dtype, shape, offset)
            else:
                start = -1 - offset
                outputs[name] = np.frombuffer(raw[start : start + nbytes], dtype_of(dtype)).reshape(shape)
        return Result(outputs, queue_s, compute_s, batch_size, input_s, output_s)

    def _send(self, header: Any, raw: Sequence[bytes | memoryview] = ()) -> None:
        if self.protocol is None:
            raise CoreUnavailable("the engine core is not connected; retry")
        self.protocol.send(header, raw)

    # ------------------------------------------------------------------ calls
    async def describe(self, name: str, version: str | None) -> ModelInfo | None:
        """The model's decoding info, cached; None: the core serves its requests whole."""
        if self.draining:
            raise CoreUnavailable("this front end is draining; retry")
        key = (name, version)
        known = self._catalog.get(key)
        if isinstance(known, ModelInfo):
            return known
        if known is not None and time.monotonic() < known:
            return None
        if self.draining:
            raise CoreUnavailable("this front end is draining; retry")
        if not self.connected.is_set():
            raise CoreUnavailable("the engine core is not connected; retry")
        request_id = self._next_id
        self._next_id += 1
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = _Pending(future, None, infer=False)
        self._send((channel.DESCRIBE, request_id, name, version))
        info = await future
        self._catalog[key] = info if info is not None else time.monotonic() + NEGATIVE_TTL_S
        return info

    def forget(self, name: str, version: str | None) -> None:
        self._catalog.pop((name, version), None)

    def submit(
        self, info: ModelInfo, request: InferRequest, protocol: str
    ) -> tuple[int, asyncio.Future[Result]]:
        """Write the request's tensors into the slab and send it; its id and answer future."""
        arrays = request.inputs  # any layout: the slab write (or inline's copy) orders C
        in_bytes = 0
        for value in arrays.values():
            in_bytes += value.nbytes + 64
        out_bytes = -1
        if info.out_bytes_per_row is not None:
            out_bytes = info.out_bytes_per_row * request.rows + 64 * len(info.outputs)
        block = self.ring.allocate(in_bytes + max(out_bytes, 0))
        raw: list[memoryview] = []
        if block is not None:
            refs, end = pack(arrays, block)
            for (_, _, _, offset, _), value in zip(refs, arrays.values(), strict=True):
                self.slab.write(offset, value)
            answer_at = (end, out_bytes)
        else:  # the ring is full: the tensors travel in the frame
            refs, raw = inline(arrays)
            answer_at = (0, -1)
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        meta = (request.id, request.batched, request.rows, request.priority, request.timeout_us,
                request.outputs, request.parameters, protocol, request.sequence)  # fmt: skip
        try:
            self._send((channel.INFER, request_id, info.token, info.name, info.version, answer_at,
                        refs, meta), raw)  # fmt: skip
        except CoreUnavailable:
            if block is not None:
                self.ring.free(block)
            raise
        self._pending[request_id] = _Pending(future, block)
        return request_id, future

    def cancel(self, request_id: int) -> None:
        if request_id in self._pending and self.protocol is not None:
            self.protocol.send((channel.CANCEL, request_id))

    def count(self, name: str, version: str | None, outcome: str) -> None:
        if self.protocol is not None:
            self.protocol.send((channel.COUNT, name, version, request_protocol.get(), outcome))


# ---------------------------------------------------------------------- the admission path's view


@dataclass(slots=True)
class SpecEngine:
    """The specs a front end decodes and encodes against (the engine itself is in the core)."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]


class _Counter:
    __slots__ = ("client", "name", "outcome", "version")

    def __init__(self, client: CoreClient, name: str, version: str, outcome: str) -> None:
        self.client, self.name, self.version, self.outcome = client, name, version, outcome

    def inc(self, amount: int = 1) -> None:
        for _ in range(amount):
            self.client.count(self.name, self.version, self.outcome)


class _Outcomes:
    """``metrics.outcome[...]`` for refusals the front end answers: counted in the core."""

    def __init__(self, client: CoreClient, name: str, version: str) -> None:
        self._counters: dict[str, _Counter] = {}
        self.client, self.name, self.version = client, name, version

    def __getitem__(self, outcome: str) -> _Counter:
        counter = self._counters.get(outcome)
        if counter is None:
            counter = self._counters[outcome] = _Counter(self.client, self.name, self.version, outcome)
        return counter


@dataclass(slots=True)
class _Metrics:
    outcome: _Outcomes


@dataclass(slots=True)
class _Serving:
    check_values: bool


class RemoteItem:
    """One request on its way to the core (what ``make_item`` gives ``infer``)."""

    __slots__ = ("request", "request_id")

    def __init__(self, request: InferRequest) -> None:
        self.request = request
        self.request_id: int | None = None


class RemoteRuntime:
    """A model served by the core, as the admission path and the encoders see a runtime."""

    class_labels = None  # classification requests go to the core whole
    config = None  # decoupled models' requests go to the core whole
    draining = False
    ready = True

    def __init__(self, client: CoreClient, info: ModelInfo, asked_version: str | None) -> None:
        self.client = client
        self.info = info
        self.asked_version = asked_version  # the version requests name (None: the core's choice)
        self.name = info.name
        self.version = info.version
        self.engine = SpecEngine(info.inputs, info.outputs)
        self.request_max_batch = info.request_max_batch
        self.serving = _Serving(info.check_values)
        self.metrics = _Metrics(_Outcomes(client, info.name, info.version))

    def make_item(self, request: InferRequest) -> RemoteItem:
        if request.priority > self.info.priority_levels:
            raise ValueError(f"priority {request.priority} outside 0..{self.info.priority_levels}")
        return RemoteItem(request)

    async def infer(self, item: RemoteItem) -> Result:
        """The core's answer. A model reloaded since it was described is described again and
        the request resent when its tensors still fit (same specs); else UNAVAILABLE, retry."""
        for _ in range(2):
            request_id, future = self.client.submit(self.info, item.request, request_protocol.get())
            item.request_id = request_id
            try:
                return await future
            except StaleModel:
                self.client.forget(self.name, self.asked_version)
                fresh = await self.client.describe(self.name, self.asked_version)
                if fresh is None or (fresh.inputs, fresh.outputs, fresh.request_max_batch) != (
                    self.info.inputs, self.info.outputs, self.info.request_max_batch):  # fmt: skip
                    break
                self.info = fresh
            except asyncio.CancelledError:
                self.client.cancel(request_id)
                raise
        raise RemoteError(Status.UNAVAILABLE.value, f"model {self.name!r} was reloaded; retry", True)

    def cancel(self, item: RemoteItem) -> None:
        if item.request_id is not None:
            self.client.cancel(item.request_id)
