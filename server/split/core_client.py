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
from wattserve.server.split.slab import RingAllocator, Slab, aligned, dtype_code, dtype_of, inline, pack

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
    future: asyncio.Future[Any] | None  # None for a group: its members' futures answer
    block: int | None  # the slab block holding the request and its answer (freed on answer)
    infer: bool = True  # an inference's answer (else a description)
    members: list[asyncio.Future[Result]] | None = None  # a group's requests, in row order


class _Group:
    """One-row requests to one model decoded in this loop turn, sent at its end as one
    multi-row request (``ModelInfo.group_rows``): the core admits, queues and answers them
    as one item, and each member gets its own row of the answer. Members share the model,
    priority, timeout, protocol and input dtypes and shapes (the group's key)."""

    __slots__ = ("futures", "id", "info", "key", "protocol", "requests")

    def __init__(self, request_id: int, info: ModelInfo, key: tuple, protocol: str) -> None:
        self.id = request_id
        self.info = info
        self.key = key
        self.protocol = protocol
        self.requests: list[InferRequest] = []
        self.futures: list[asyncio.Future[Result]] = []


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
        self._groups: dict[tuple, _Group] = {}  # this turn's groups, sent by the next flush
        self.grouped = 0  # requests sent in groups of two or more (a test's and a benchmark's view)
        self.draining = False  # SIGTERM: new inferences are refused (503), those in flight answered

    @property
    def inflight(self) -> int:
        return len(self._pending) + sum(len(group.futures) for group in self._groups.values())

    async def idle(self) -> None:
        """Return once nothing is in flight (a drain's wait)."""
        while self._pending or self._groups:
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
        protocol.before_flush = self._send_groups
        await loop.create_unix_connection(lambda: protocol, sock=sock)
        self.protocol = protocol
        self._catalog.clear()  # a new core: every model described again
        self.connected.set()
        log.info("connected to the engine core")

    def _on_lost(self, exc: BaseException | None) -> None:
        self.connected.clear()
        self.protocol = None
        pending, self._pending = self._pending, {}
        unsent, self._groups = self._groups, {}
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        for group in unsent.values():
            _fail(group.futures, CoreUnavailable("the engine core went away; retry"))
        for entry in pending.values():
            if entry.block is not None:
                self.ring.free(entry.block)
            _fail(_futures(entry), CoreUnavailable("the engine core went away; retry"))
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
            stale = status == "STALE"  # not a Status: the core's word for a reloaded model
            for waiter in _futures(entry):
                if not waiter.done():
                    waiter.set_exception(
                        StaleModel(message) if stale else RemoteError(status, message, retry_after)
                    )
            return
        if entry.members is not None:
            self._answer_group(entry.members, block, payload, raw)
            return
        assert future is not None
        if not entry.infer:  # a description
            if not future.done():
                future.set_result(payload)
            return
        if future.done():  # its waiter left (cancelled): nobody reads the answer
            if block is not None:
                self.ring.free(block)
            return
        future.set_result(self._answer_in(payload, raw, block))

    def _answer_group(self, members: list[asyncio.Future[Result]], block: int | None, payload: Any,
                      raw: memoryview) -> None:  # fmt: skip
        """A group's answer: each member its own row of each output (views, as for one
        request; the block is freed after this read, as for one)."""
        whole = self._answer_in(payload, raw, block)
        outputs = whole.outputs
        timing = (whole.queue_time_s, whole.compute_time_s, whole.batch_size, whole.input_s, whole.output_s)
        for row, future in enumerate(members):
            if not future.done():  # else its waiter left: nobody reads its row
                end = row + 1
                future.set_result(Result({name: value[row:end] for name, value in outputs.items()}, *timing))

    def _answer_in(self, payload: Any, raw: memoryview, block: int | None) -> Result:
        """The answer over its slab block (``_answer``), the block freed after this read's
        wake-ups; freed at once when the answer cannot be read.

        The answer's tensors are views of the block, read by the encoder in the step this
        wakes (the awaiting task resumes, encodes and copies into the response body with no
        await between: HTTP's infer route and gRPC's ModelInfer both); the block is reused
        only after that step: the blocks answered in one read are freed by one call_soon
        queued after the read (_on_read), so after every wake-up it queued."""
        try:
            result = self._answer(payload, raw)
        except BaseException:
            if block is not None:
                self.ring.free(block)
            raise
        if block is not None:
            self._answered_blocks.append(block)
        return result

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
        """Write the request's tensors into the slab and send it; its id and answer future.
        A one-row request to a model that takes groups joins this turn's group instead (sent
        by the flush at the end of the turn; the id is the group's)."""
        if info.group_rows and request.rows == 1 and request.batched and not request.parameters and (
            request.sequence is None
        ):  # fmt: skip
            return self._join(info, request, protocol)
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._send_request(request_id, info, request, protocol, future)
        return request_id, future

    def _send_request(self, request_id: int, info: ModelInfo, request: InferRequest, protocol: str,
                      future: asyncio.Future[Result]) -> None:  # fmt: skip
        """One request's tensors into the slab (inline when it is full) and its frame sent."""
        arrays = request.inputs
        in_bytes = 0
        for value in arrays.values():
            in_bytes += value.nbytes + 64
        out_bytes = _answer_bytes(info, request.rows)
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
        meta = (request.id, request.batched, request.rows, request.priority, request.timeout_us,
                request.outputs, request.parameters, protocol, request.sequence, 1)  # fmt: skip
        self._send_infer(request_id, info, answer_at, refs, meta, raw, _Pending(future, block))

    def _send_infer(self, request_id: int, info: ModelInfo, answer_at: tuple[int, int], refs: list[Any],
                    meta: tuple, raw: list[memoryview], pending: _Pending) -> None:  # fmt: skip
        """The INFER frame of a request (or a group) whose tensors are placed; its answer owed
        to ``pending`` (whose slab block is freed if the frame cannot go)."""
        try:
            self._send((channel.INFER, request_id, info.token, info.name, info.version, answer_at,
                        refs, meta), raw)  # fmt: skip
        except CoreUnavailable:
            if pending.block is not None:
                self.ring.free(pending.block)
            raise
        self._pending[request_id] = pending

    def _join(
        self, info: ModelInfo, request: InferRequest, protocol: str
    ) -> tuple[int, asyncio.Future[Result]]:
        """Add a one-row request to this turn's group for its key (a full group goes now)."""
        if self.protocol is None:
            raise CoreUnavailable("the engine core is not connected; retry")
        inputs = request.inputs
        key = (info.token, info.name, info.version, request.priority, request.timeout_us, protocol,
               *[(name, value.dtype, value.shape) for name, value in inputs.items()])  # fmt: skip
        group = self._groups.get(key)
        if group is None or len(group.futures) >= info.group_rows:
            if group is not None:  # full: it goes in this turn's flush, as it is
                self._send_group(group)
            group = self._groups[key] = _Group(self._next_id, info, key, protocol)
            self._next_id += 1
            self.protocol.wake()
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        group.requests.append(request)
        group.futures.append(future)
        return group.id, future

    def _send_groups(self) -> None:
        """The flush's first step: send every group formed this turn."""
        groups, self._groups = self._groups, {}
        for group in groups.values():
            self._send_group(group)

    def _send_group(self, group: _Group) -> None:
        """Send a group as one request of its members' rows, in order (members whose waiter
        already left are not sent); a group of one goes as that request."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        live = [(request, future) for request, future in zip(group.requests, group.futures, strict=True)
                if not future.done()]  # fmt: skip
        if not live:
            return
        info, protocol = group.info, group.protocol
        first = live[0][0]
        rows = len(live)
        try:
            if rows == 1:
                self._send_request(group.id, info, first, protocol, live[0][1])
                return
            self._send_rows(group.id, info, [request.inputs for request, _ in live], first, protocol,
                            [future for _, future in live])  # fmt: skip
        except Exception as exc:  # the core went away (CoreUnavailable), or a bug: answered, never lost
            _fail([future for _, future in live], exc)
            return
        self.grouped += rows

    def _send_rows(self, request_id: int, info: ModelInfo, members: list[dict[str, np.ndarray]],
                   first: InferRequest, protocol: str,
                   futures: list[asyncio.Future[Result]]) -> None:  # fmt: skip
        """The members' rows gathered straight into one slab block (one copy per input; the
        frame carries them when the slab is full), with room for the group's answer."""
        rows = len(members)
        names = list(members[0])
        out_bytes = _answer_bytes(info, rows)  # fixed-size answers: group_rows is 0 otherwise
        in_bytes = sum(value.nbytes * rows + 64 for value in members[0].values())
        block = self.ring.allocate(in_bytes + out_bytes)
        raw: list[memoryview] = []
        if block is not None:
            refs: list[Any] = []
            offset = block
            for name in names:
                one = members[0][name]
                shape = (rows, *one.shape[1:])
                target = np.ndarray(shape, dtype=one.dtype, buffer=self.slab.map, offset=offset)
                np.concatenate([inputs[name] for inputs in members], out=target)
                refs.append((name, dtype_code(one.dtype), shape, offset, target.nbytes))
                offset += aligned(target.nbytes)
            answer_at = (offset, out_bytes)
        else:
            refs, raw = inline({name: np.concatenate([inputs[name] for inputs in members]) for name in names})
            answer_at = (0, -1)
        meta = (None, True, rows, first.priority, first.timeout_us, None, None, protocol, None, rows)
        self._send_infer(request_id, info, answer_at, refs, meta, raw, _Pending(None, block, True, futures))

    def cancel(self, request_id: int) -> None:
        """A waiter left. A group is cancelled in the core once every member's waiter has
        (until then its rows are computed and the left ones' dropped); an unsent group
        leaves its left members behind when it goes."""
        entry = self._pending.get(request_id)
        if entry is None or self.protocol is None:
            return
        if entry.members is not None and not all(future.done() for future in entry.members):
            return
        self.protocol.send((channel.CANCEL, request_id))

    def count(self, name: str, version: str | None, outcome: str) -> None:
        if self.protocol is not None:
            self.protocol.send((channel.COUNT, name, version, request_protocol.get(), outcome))


def _answer_bytes(info: ModelInfo, rows: int) -> int:
    """Slab room for the answer of ``rows`` rows, or -1 when the outputs' size varies."""
    if info.out_bytes_per_row is None:
        return -1
    return info.out_bytes_per_row * rows + 64 * len(info.outputs)


def _futures(entry: _Pending) -> list[asyncio.Future[Any]]:
    if entry.members is not None:
        return entry.members
    assert entry.future is not None
    return [entry.future]


def _fail(futures: list[asyncio.Future[Any]], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)


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
