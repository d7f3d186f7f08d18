"""The engine core's side of the channel: front ends connect, the core admits and answers.

The core holds the ``ModelSet`` (queues, batchers, engine instances) as a single-process
server does. A front end sends each decoded request as names, shapes and slab offsets; the
core looks the model up (the same ``select`` as every front end: readiness, queue room),
builds the request over views of the front end's slab (no copy), submits it to the model's
runtime, and writes the answer's tensors into the space the front end reserved with the
request. The per-request work here is bookkeeping; parsing and encoding stayed in the
front end.

A front end that disconnects (killed, crashed) takes its requests with it: each is
cancelled (a queued one is never computed) and counted in
``wattserve_frontend_lost_requests_total``; the other front ends are not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter
from wattserve.batchers.status import Status
from wattserve.batchers.types import RequestError, Result, WorkItem
from wattserve.engines.base import StepEngine
from wattserve.engines.request_engines import RunsRequests
from wattserve.server.core.admission import Refused, select
from wattserve.server.core.bytes_tensors import BYTES
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.models.metrics import request_protocol
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.split import channel
from wattserve.server.split.slab import Slab, TensorRef, from_inline, inline, pack
from wattserve.telemetry.counter_add import counter_add

log = logging.getLogger("wattserve.core")

HELLO_BYTES = 4096

Answer = Callable[[Result | None, BaseException | None], None]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a front end needs to decode and encode a model's requests by itself."""

    name: str
    version: str
    token: int  # which runtime this describes: a reload gets a new one (a stale front end re-asks)
    inputs: tuple[Any, ...]  # TensorSpec
    outputs: tuple[Any, ...]
    request_max_batch: int
    check_values: bool
    priority_levels: int
    out_bytes_per_row: int | None  # answer bytes per row when every output's shape is fixed
    # the most one-row requests a front end may send as one item (a group); 0: each alone
    group_rows: int = 0


def fast_path_refusal(runtime: ModelRuntime) -> str | None:
    """Why this model's requests go to the core whole (over its HTTP/gRPC), or None: the
    front end decodes and encodes them itself."""
    engine = runtime.engine
    if engine is None or not runtime.ready:
        return "not ready"
    if type(runtime) is not ModelRuntime:
        return "an ensemble"
    if isinstance(engine, StepEngine) or getattr(engine, "streams_tokens", False):
        return "an iteration-level model"
    if any(spec.datatype == BYTES for spec in (*engine.inputs, *engine.outputs)):
        return "BYTES tensors"
    return None


GROUP_SHARE = 8  # a group holds at most 1/8 of the model's max batch (see group_rows)


def group_rows(runtime: ModelRuntime, out_bytes_per_row: int | None) -> int:
    """How many one-row requests a front end may send as one multi-row item, or 0.

    A front end decodes many requests per event-loop turn; sent as one item they cost the
    core one admission, one queue entry and one answer instead of one each (the core's CPU
    per request is what bounds the whole server on a host with many cores). The batcher
    never splits an item, so a group is kept to an eighth of the max batch: a batch left
    short because the next item did not fit loses at most that. Only models where nothing
    treats a request by itself (``ModelRuntime.groups_requests``) and whose answers have a
    fixed size per row (the front end finds each member's rows in the group's answer)."""
    if out_bytes_per_row is None or not runtime.groups_requests():
        return 0
    rows = runtime.request_max_batch // GROUP_SHARE
    return rows if rows >= 2 else 0


def describe(runtime: ModelRuntime, token: int) -> ModelInfo:
    engine = runtime.engine
    assert engine is not None
    per_row: int | None = 0
    for spec in engine.outputs:
        if spec.variable or per_row is None:
            per_row = None
        else:
            per_row += int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
    return ModelInfo(runtime.name, runtime.version, token, tuple(engine.inputs), tuple(engine.outputs),
                     runtime.request_max_batch, runtime.serving.check_values, runtime.priority_levels,
                     per_row, group_rows(runtime, per_row))  # fmt: skip


class CoreService:
    """Listens on the channel socket; one ``FrontEndLink`` per connected front end."""

    def __init__(self, models: ModelSet, path: str, registry: CollectorRegistry) -> None:
        self.models = models
        self.path = path
        self.lost = Counter(
            "wattserve_frontend_lost_requests",
            "Requests whose front-end process went away before their answer (cancelled, never "
            "computed if still queued).",
            registry=registry,
        )
        self.requests = Counter(
            "wattserve_frontend_requests",
            "Inference requests each front-end process decoded and handed to the engine core "
            "(how the kernel spread the connections over them).",
            ("frontend",),
            registry=registry,
        )
        self.grouped = Counter(
            "wattserve_frontend_grouped_requests",
            "Of those, the requests that came in a front end's groups (one-row requests to a "
            "model decoded in one loop turn, admitted and answered as one item).",
            ("frontend",),
            registry=registry,
        )
        self.groups = Counter(
            "wattserve_frontend_groups",
            "The groups those came in (grouped requests / groups: the mean group size).",
            ("frontend",),
            registry=registry,
        )
        self.links: set[FrontEndLink] = set()
        self._tokens: weakref.WeakKeyDictionary[ModelRuntime, int] = weakref.WeakKeyDictionary()
        # tokens never repeat across core restarts: a front end's description from the last
        # core can never pass for one of this core's runtimes
        self._next_token = time.time_ns()
        self._keeps: weakref.WeakKeyDictionary[ModelRuntime, bool] = weakref.WeakKeyDictionary()
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    def keeps_inputs(self, runtime: ModelRuntime) -> bool:
        """Whether the model may keep an input past its batch (a Python model's own state,
        the response cache's stored answers when an output is an input): such a model gets
        its own copy of the slab's tensors. Asked once per runtime (a Protocol isinstance
        costs microseconds)."""
        keeps = self._keeps.get(runtime)
        if keeps is None:
            keeps = runtime.response_cache is not None or isinstance(runtime.engine, RunsRequests)
            self._keeps[runtime] = keeps
        return keeps

    def token(self, runtime: ModelRuntime) -> int:
        token = self._tokens.get(runtime)
        if token is None:
            token = self._tokens[runtime] = self._next_token
            self._next_token += 1
        return token

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept(), name="core-channel-accept")

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        for link in list(self.links):
            link.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = loop.create_task(self._handshake(sock))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket) -> None:
        """The hello carries the front end's slab descriptor (SCM_RIGHTS), read off the loop."""
        loop = asyncio.get_running_loop()
        try:
            sock.setblocking(True)
            sock.settimeout(5.0)
            message, fds, _, _ = await asyncio.to_thread(socket.recv_fds, sock, HELLO_BYTES, 1)
            hello = pickle.loads(message)
            slab = Slab(fds[0], hello["slab_bytes"])
            sock.sendall(pickle.dumps({"pid": os.getpid()}))
            sock.setblocking(False)
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, IndexError) as exc:
            log.warning("a front end's hello failed: %s", exc)
            sock.close()
            return
        link = FrontEndLink(self, slab, hello.get("pid", 0), str(hello.get("index", 0)))
        await loop.connect_accepted_socket(lambda: link.protocol, sock)
        self.links.add(link)
        log.info("front end %s connected (slab %d MiB)", link.pid, slab.size >> 20)


class FrontEndLink:
    """One front end's connection: its slab, its requests in flight."""

    def __init__(self, service: CoreService, slab: Slab, pid: int, index: str) -> None:
        self.service = service
        self.slab = slab
        self.pid = pid
        # a restarted front end keeps its index (so its counters); added to once per read
        self.served = counter_add(service.requests.labels(index))
        self.grouped = counter_add(service.grouped.labels(index))
        self.groups = counter_add(service.groups.labels(index))
        self.protocol = channel.FrameProtocol(self._on_frame, self._on_lost, self._on_read)
        self.inflight: dict[int, tuple[ModelRuntime, WorkItem, asyncio.Task[None] | None]] = {}
        # Per read (one burst of frames, handled in one go on the loop, where nothing else
        # can change a model's state): the models its requests were admitted to, with
        # their token and whether they keep inputs, and how many requests it carried.
        self._admitted: dict[tuple[str, str | None], tuple[ModelRuntime, int, bool]] = {}
        self._burst = 0
        self._grouped = 0  # ... of them in groups
        self._groups = 0

    def close(self) -> None:
        self.protocol.close()

    # ------------------------------------------------------------------ frames in
    def _on_frame(self, header: Any, raw: memoryview) -> None:
        kind = header[0]
        if kind == channel.INFER:
            self._infer(header, raw)
        elif kind == channel.CANCEL:
            entry = self.inflight.get(header[1])
            if entry is not None:
                entry[0].cancel(entry[1])
        elif kind == channel.COUNT:
            self._count(*header[1:])
        elif kind == channel.DESCRIBE:
            self._describe(header[1], header[2], header[3])

    def _on_read(self) -> None:
        if self._burst:
            self.served(self._burst)
            self._burst = 0
            if self._groups:
                self.grouped(self._grouped)
                self.groups(self._groups)
                self._grouped = self._groups = 0
        self._admitted.clear()

    def _admit(self, name: str, version: str | None) -> tuple[ModelRuntime, int, bool]:
        """The runtime for this read's requests to a model: ``select`` (readiness, draining)
        for its first; the queue's room is checked for each by ``enqueue``."""
        admitted = self._admitted.get((name, version))
        if admitted is None:
            service = self.service
            runtime = select(service.models, name, version)
            admitted = (runtime, service.token(runtime), service.keeps_inputs(runtime))
            self._admitted[(name, version)] = admitted
        return admitted

    def _describe(self, request_id: int, name: str, version: str | None) -> None:
        try:
            runtime = self.service.models.lookup(name, version).runtime
        except Exception:  # unknown: the front end hands such requests to the core whole
            runtime = None
        info = None
        if runtime is not None and fast_path_refusal(runtime) is None:
            info = describe(runtime, self.service.token(runtime))
        self.protocol.send((channel.ANSWER, request_id, True, info))

    def _count(self, name: str, version: str | None, protocol: str, outcome: str, amount: int = 1) -> None:
        """A refusal the front end answered itself (a bad body): counted here, where /metrics is."""
        try:
            runtime = self.service.models.lookup(name, version).runtime
        except Exception:
            return
        if runtime is not None:
            reset = request_protocol.set(protocol)
            try:
                runtime.metrics.outcome[outcome].inc(amount)
            finally:
                request_protocol.reset(reset)

    def _infer(self, header: Any, raw: memoryview) -> None:
        _, request_id, token, name, version, block, refs, meta = header
        requests = meta[9]  # more than 1: a front end's group, one item answering them all
        self._burst += requests
        if requests != 1:
            self._grouped += requests
            self._groups += 1
        protocol = meta[7]
        reset = request_protocol.set(protocol)  # the answer's callback and task copy the context
        try:
            try:
                runtime, runtime_token, keeps = self._admit(name, version)
                if runtime_token != token:  # reloaded since the front end asked
                    self._answer_error(request_id, ("STALE", "model reloaded", False))
                    return
                item = runtime.make_item(self._request(keeps, refs, meta, raw))
                if requests != 1:
                    item.requests = requests
            except Refused as refused:
                if requests != 1 and refused.outcome is not None:  # select counted one of them
                    self._count(name, version, protocol, refused.outcome, requests - 1)
                self._answer_error(request_id, (refused.status.value, str(refused), refused.retry_after))
                return
            except (BadRequest, ValueError) as exc:
                runtime.metrics.outcome["bad_request"].inc(requests)
                status = getattr(exc, "status", Status.INVALID_ARG)
                self._answer_error(request_id, (status.value, str(exc), False))
                return
            answer = partial(self._answered, request_id, block)
            try:
                queued = runtime.submit_nowait(item, answer, protocol)  # no task per request
            except RequestError as exc:
                self._answer_error(request_id, (exc.status.value, str(exc), exc.retry_after))
                return
            except ValueError as exc:
                self._answer_error(request_id, (Status.INVALID_ARG.value, str(exc), False))
                return
            task = None
            if not queued:  # a model whose infer does more than queue (cache, ordering)
                task = asyncio.get_running_loop().create_task(self._run(runtime, item, answer))
            self.inflight[request_id] = (runtime, item, task)
        finally:
            request_protocol.reset(reset)

    def _request(self, keeps: bool, refs: list[TensorRef], meta: Any, raw: memoryview) -> InferRequest:
        """The request over views of the slab (copies for a model that keeps its inputs)."""
        request_id, batched, rows, priority, timeout_us, outputs, parameters, _, sequence, _ = meta
        slab = self.slab
        inputs: dict[str, np.ndarray] = {}
        for name, dtype, shape, offset, nbytes in refs:
            if offset >= 0:
                array = slab.array(dtype, shape, offset)
                inputs[name] = array.copy() if keeps else array
            else:
                inputs[name] = from_inline(raw, dtype, shape, offset, nbytes)
        request = InferRequest(request_id, inputs, batched, rows, priority, timeout_us, outputs)
        if parameters:
            request.parameters = parameters
        if sequence is not None:  # a stateful model's correlation ID and flags
            request.sequence = sequence
        return request

    # ------------------------------------------------------------------ answers out
    async def _run(self, runtime: ModelRuntime, item: WorkItem, answer: Answer) -> None:
        """``infer`` awaited, for a model whose infer does more than queue."""
        try:
            result = await runtime.infer(item)
        except asyncio.CancelledError:  # the link is gone: nobody to answer
            raise
        except Exception as exc:
            answer(None, exc)
            return
        answer(result, None)

    def _answered(self, request_id: int, block: tuple[int, int], result: Result | None,
                  error: BaseException | None) -> None:  # fmt: skip
        """The request's one answer: its outputs into the space reserved in the slab (or
        inline when there was none), or its error."""
        if self.inflight.pop(request_id, None) is None:
            return  # the link went away: nobody to answer
        if error is not None:
            if isinstance(error, RequestError):
                self._answer_error(request_id, (error.status.value, str(error), error.retry_after))
            else:  # a bug below: still exactly one answer
                log.error("request %d failed: %r", request_id, error)
                self._answer_error(request_id, (Status.INTERNAL.value, f"internal error: {error}", False))
            return
        assert result is not None
        out_offset, out_size = block
        outputs = result.outputs  # any layout: the slab write (or inline's copy) orders C
        refs, end = pack(outputs, out_offset)
        raw: list[memoryview] = []
        if out_size >= 0 and end - out_offset <= out_size:
            for (_, _, _, offset, _), value in zip(refs, outputs.values(), strict=True):
                self.slab.write(offset, value)
        else:  # no room reserved (variable shapes): inline, after the header
            refs, raw = inline(outputs)
        timing = (result.queue_time_s, result.compute_time_s, result.batch_size, result.input_s,
                  result.output_s)  # fmt: skip
        self.protocol.send((channel.ANSWER, request_id, True, (refs, timing)), raw)

    def _answer_error(self, request_id: int, error: tuple[str, str, bool]) -> None:
        self.protocol.send((channel.ANSWER, request_id, False, error))

    def _on_lost(self, exc: BaseException | None) -> None:
        """The front end went away: its requests are cancelled (never computed if queued)."""
        self.service.links.discard(self)
        lost = list(self.inflight.values())
        self.inflight.clear()
        for runtime, item, task in lost:
            runtime.cancel(item)  # its answer (cancelled) is counted and goes nowhere
            if task is not None:
                task.cancel()
        if lost:
            requests = sum(item.requests for _, item, _ in lost)
            self.service.lost.inc(requests)
            log.warning("front end %s went away with %d request(s) in flight; cancelled", self.pid, requests)
        # the slab stays mapped until the cancelled batches that may read it have let go
        asyncio.get_running_loop().call_later(30.0, self.slab.close)
