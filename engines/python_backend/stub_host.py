"""The server's side of one worker process (one life of one instance's stub).

``StubHost`` starts the process (``python -m wattserve.engines.python_backend.stub``, a fresh
interpreter: forking a server with an event loop and gRPC threads is not safe), waits for it
to say hello within the stub timeout, has it run ``initialize``, and then runs each batch
(``execute``): inputs into shared memory, the requests' metadata over the channel, the
answers back the same way. Its reader thread serves what the model asks of the server
meanwhile (BLS, a decoupled request's responses, ``is_cancelled``, custom metrics).

When the process dies, everything waiting on it fails at once: the batch in ``execute``
(its caller answers each request with one error), the decoupled streams it had left open
(each ends with one error response), the custom metric series it held (released). A host
is not reused after that: ``ProcessModelEngine`` starts another.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from wattserve.batchers.types import SequenceTag
from wattserve.engines.python_backend import shm
from wattserve.engines.python_backend.channel import Channel, Closed, reply
from wattserve.engines.python_backend.custom_metrics import CustomMetrics
from wattserve.engines.python_backend.engine import ModelFailed, PythonModelFile
from wattserve.engines.python_backend.metrics_bridge import MetricsHost
from wattserve.engines.python_backend.protocol import (
    RequestMeta,
    decode_error,
    encode_error,
    joined,
    split,
)
from wattserve.engines.request_engines import ModelCaller, RequestInput

log = logging.getLogger("wattserve.python_backend")
STUB_MODULE = "wattserve.engines.python_backend.stub"
SERVICE_THREADS = 8  # per worker: BLS calls waiting on other models, BLS streams


class StubFailed(Exception):
    """The worker process died, hung past the execute timeout, or could not start.
    ``streamed``: per request of the failed batch, whether its stream had already ended
    (its final response went out: it is answered, the batch's error must not answer it
    again)."""

    def __init__(self, message: str | None, streamed: list[bool] | None = None) -> None:
        super().__init__(message)
        self.streamed = streamed or []


@dataclass
class InFlight:
    """A request the worker holds: how to ask whether its client has gone, and where a
    decoupled request's responses go (until the final one)."""

    cancelled: Callable[[], bool]
    stream_gone: Callable[[], bool] | None
    sink: Callable[..., None] | None
    executing: bool = True
    finished: bool = False


class StubHost:
    def __init__(
        self,
        model: PythonModelFile,
        device: str,
        instance: int,
        store: CustomMetrics,
        caller: Callable[[], ModelCaller | None],
        stub_timeout_s: float,
    ) -> None:
        self.instance_name = f"{model.name}_0_{instance}"
        self.prefix = shm.new_prefix(self.instance_name)
        self.names = shm.Namer(self.prefix, "s")
        self.metrics = MetricsHost(store)
        self.dead: str | None = None  # why, once the process is gone
        self._caller = caller
        self._stub_timeout = stub_timeout_s
        self._closing = False
        self._lock = threading.Lock()
        self._requests: dict[str, InFlight] = {}
        self._cleared = False  # the worker is gone and its requests were settled (``_gone``)
        self._batches = iter(range(1 << 62))
        self._service = ThreadPoolExecutor(SERVICE_THREADS, thread_name_prefix=f"pb-{self.instance_name}")
        work, work_child = socket.socketpair()
        events, events_child = socket.socketpair()
        fds = (work_child.fileno(), events_child.fileno())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", STUB_MODULE, *map(str, fds), self.prefix, str(_log_level())],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            work.close()
            events.close()
            raise
        finally:
            work_child.close()
            events_child.close()
        # two lanes: ``work`` carries init/execute/finalize and their answers, one at a time,
        # read by the thread that asked (no hand-over between threads on a batch's path);
        # ``channel`` everything else, read by the reader thread
        self.work = Channel(work)
        self.channel = Channel(events)
        self._reader = threading.Thread(
            target=self._read, name=f"pb-{self.instance_name}-reader", daemon=True
        )
        self._reader.start()
        threading.Thread(target=self._watch, name=f"pb-{self.instance_name}-watch", daemon=True).start()
        try:
            self._initialize(model, device, instance)
        except BaseException:
            self.kill("its start failed")
            self._reader.join()
            raise

    def _initialize(self, model: PythonModelFile, device: str, instance: int) -> None:
        try:
            self._answer(self._stub_timeout)  # its hello
        except TimeoutError:
            why = f"its process did not start within {self._stub_timeout:g} s (python_stub_timeout_s)"
            raise StubFailed(f"Python model instance {self.instance_name!r}: {why}") from None
        self.work.send(("init", model, device, instance))
        ok, value = self._answer(None)  # initialize may take as long as it takes; a death ends it
        if not ok:
            raise ModelFailed(str(decode_error(value)))

    def _answer(self, timeout_s: float | None) -> tuple[bool, Any]:
        """The worker's next answer on the work lane; StubFailed once it is gone,
        TimeoutError after ``timeout_s``."""
        self.work.sock.settimeout(timeout_s)
        try:
            kind, *rest = self.work.recv()
        except TimeoutError:
            raise
        except Closed:
            raise StubFailed(self._exited()) from None
        return (True, rest[0]) if kind in ("ok", "hello") else (False, rest[0])

    # ------------------------------------------------------------------ execute
    def execute(
        self, requests: Sequence[RequestInput], timeout_s: float | None
    ) -> list[dict[str, np.ndarray] | BaseException]:
        """One execute in the worker; StubFailed if it died or outlasted ``timeout_s``."""
        batch = next(self._batches)
        layout = shm.write(self.names(), joined([inputs for inputs, _, _ in requests]))
        metas: list[RequestMeta] = []
        states: dict[str, InFlight] = {}
        for i, (_, context, cancelled) in enumerate(requests):
            key = f"{batch}.{i}"
            sink = getattr(context, "response_sink", None)
            states[key] = InFlight(cancelled, getattr(context, "response_cancelled", None), sink)
            parameters = getattr(context, "parameters", None)
            tag = getattr(context, "sequence", None)  # its implicit state stays here: not a Python model's
            sequence = None if tag is None else SequenceTag(tag.correlation_id, tag.start, tag.end)
            metas.append(RequestMeta(key, getattr(context, "id", None), getattr(context, "outputs", None),
                                     parameters if isinstance(parameters, dict | str) else None,
                                     sink is not None, sequence))  # fmt: skip
        with self._lock:
            if self._cleared:
                shm.discard(layout)
                raise StubFailed(self.dead)
            self._requests.update(states)
        try:
            self.work.send(("execute", layout, metas))
            ok, value = self._answer(timeout_s)
        except TimeoutError:
            self.kill(f"execute did not return within {timeout_s:g} s (python_execute_timeout_s)")
            raise StubFailed(self.dead, self._settle(states)) from None
        except (StubFailed, Closed):
            why = self._exited()
            raise StubFailed(why, self._settle(states)) from None
        if not ok:  # the worker's own failure outside the model (the model's are per request)
            self._forget(states)
            error = decode_error(value)
            return [error for _ in requests]
        outputs_layout, errors = value
        outputs = split(shm.read(outputs_layout), len(requests))
        orphans: list[InFlight] = []
        with self._lock:
            for key, state in states.items():
                state.executing = False
                if state.sink is None or state.finished:
                    self._requests.pop(key, None)
                elif self._cleared:  # it died after answering: its streams end here, once
                    state.finished = True
                    orphans.append(state)
        for state in orphans:
            assert state.sink is not None
            state.sink(None, ModelFailed(str(self.dead)), True)
        return [outputs[i] if error is None else decode_error(error) for i, error in enumerate(errors)]

    def _forget(self, states: dict[str, InFlight]) -> None:
        with self._lock:
            for key in states:
                self._requests.pop(key, None)

    def _settle(self, states: dict[str, InFlight]) -> list[bool]:
        """The process is gone mid-batch: once the reader has delivered every response it
        sent (the events lane ends after them), which requests' streams had ended. Those are
        answered; the others get the batch's error, never a stream error as well."""
        self._reader.join(self._stub_timeout)
        self._forget(states)
        return [state.finished for state in states.values()]

    # ------------------------------------------------------------------ reader thread
    def _read(self) -> None:
        try:
            while True:
                message = self.channel.recv()
                kind = message[0]
                if kind == "response":
                    self._response(*message[1:])
                elif kind == "cancelled":
                    reply(self.channel, message[1], partial(self._cancelled, *message[2:]), encode_error)
                elif kind == "metric":
                    reply(self.channel, message[1], partial(self.metrics.handle, *message[2:]), encode_error)
                elif kind == "bls":
                    self._bls(*message[1:])
                elif kind == "bls_stream":
                    self._submit(self._bls_stream, *message[1:])
        except Closed:
            pass
        except Exception:
            log.exception("Python model instance %r: its channel broke", self.instance_name)
            self.kill("its channel broke")
        finally:
            self._gone()

    def _response(self, key: str, layout: shm.Layout | None, error: Any, final: bool) -> None:
        outputs = None if layout is None else shm.read(layout)
        with self._lock:
            state = self._requests.get(key)
            if state is None or state.sink is None or state.finished:
                return
            if final:
                state.finished = True
                if not state.executing:
                    del self._requests[key]
        state.sink(outputs, None if error is None else decode_error(error), final)

    def _cancelled(self, key: str, which: str) -> bool:
        with self._lock:
            state = self._requests.get(key)
        if state is None:
            return False
        if which == "stream":
            return bool(state.stream_gone is not None and state.stream_gone())
        return bool(state.cancelled())

    def _bls(self, call_id: int, name: str, layout: shm.Layout, *args: Any) -> None:
        inputs = shm.read(layout)
        caller = self._caller()
        if caller is None:
            reply(self.channel, call_id, _no_bls, encode_error)
            return
        try:
            future = caller(name, inputs, *args)
        except Exception as exc:  # the door refused at once (the server is stopping)
            self._send(("reply", call_id, False, encode_error(exc)))
            return
        future.add_done_callback(lambda done: self._submit(self._bls_reply, call_id, done))

    def _bls_reply(self, call_id: int, done: Future[dict[str, np.ndarray]]) -> None:
        try:
            layout = shm.write(self.names(), done.result())
        except Exception as exc:
            self._send(("reply", call_id, False, encode_error(exc)))
            return
        self._send(("reply", call_id, True, layout), layout)

    def _bls_stream(self, stream: int, name: str, layout: shm.Layout, *args: Any) -> None:
        """A service thread: every response of a BLS ``exec(decoupled=True)``, as it comes."""
        inputs = shm.read(layout)
        caller = self._caller()
        try:
            if caller is None:
                _no_bls()
            assert caller is not None
            stream_of = getattr(caller, "stream", None)
            events = (
                stream_of(name, inputs, *args) if stream_of is not None else _one(caller(name, inputs, *args))
            )
            for outputs, error, final in events:
                out = None if outputs is None else shm.write(self.names(), outputs)
                payload = None if error is None else encode_error(error)
                if not self._send(("bls_event", stream, out, payload, final), out):
                    return
        except Exception as exc:
            self._send(("bls_event", stream, None, encode_error(exc), True))

    def _send(self, message: tuple[Any, ...], layout: shm.Layout | None = None) -> bool:
        """Send, or (the worker is gone) drop the message and its segment; whether sent."""
        try:
            self.channel.send(message)
            return True
        except Closed:
            if layout is not None:
                shm.discard(layout)
            return False

    def _submit(self, work: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # shut down: the worker is gone, nobody waits
            self._service.submit(work, *args)

    # ------------------------------------------------------------------ death and close
    def _watch(self) -> None:
        """Wake both lanes' readers when the process exits, even if a child it forked keeps
        the sockets open."""
        self.process.wait()
        self.channel.shut()
        self.work.shut()

    def _exited(self) -> str:
        """Why the process is gone (it is, or is being, killed when this is asked)."""
        try:
            code = self.process.wait(self._stub_timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        with self._lock:
            if self.dead is None:
                self.dead = f"Stub process '{self.instance_name}' is not healthy ({_exit_reason(code)})"
            return self.dead

    def _gone(self) -> None:
        """Reader thread, last: the process is gone; settle everything that waited on it."""
        why = self._exited()
        with self._lock:
            self._cleared = True
            states, self._requests = list(self._requests.values()), {}
        if not self._closing:
            log.error("Python model instance %r: %s", self.instance_name, why)
        for state in states:  # streams of executes that had returned: each ends with an error
            if state.sink is not None and not state.executing and not state.finished:
                state.finished = True
                state.sink(None, ModelFailed(why), True)
        self.metrics.release_all()
        self._service.shutdown(wait=False, cancel_futures=True)
        shm.sweep(self.prefix)

    def kill(self, why: str) -> None:
        with self._lock:
            if self.dead is None:
                self.dead = f"Stub process '{self.instance_name}' was killed: {why}"
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.channel.shut()
        self.work.shut()

    def close(self) -> None:
        """Finalize in the worker (within the stub timeout), then make sure it is gone."""
        self._closing = True
        if self.dead is None:
            try:
                self.work.send(("finalize",))
                ok, value = self._answer(self._stub_timeout)
                if not ok:
                    log.warning("Python model instance %r: finalize raised %s", self.instance_name,
                                decode_error(value))  # fmt: skip
            except Exception as exc:
                log.warning("Python model instance %r: finalize failed: %s", self.instance_name, exc)
        try:
            self.process.wait(self._stub_timeout)
        except subprocess.TimeoutExpired:
            self.kill("it did not exit after finalize")
        self._reader.join()
        self.channel.close()
        self.work.close()


def _log_level() -> int:
    """The server's level for wattserve's loggers: the worker logs (and ``pb_utils.Logger``)
    at the same one."""
    return logging.getLogger("wattserve").getEffectiveLevel()


def _no_bls() -> None:
    raise ModelFailed("BLS is not available here: no server model is executing (wattserve binds a model's "
                      "BLS door once its instances are built)")  # fmt: skip


def _one(future: Future[dict[str, np.ndarray]]) -> Iterator[tuple[Any, BaseException | None, bool]]:
    """A model that does not stream, as a stream of its one answer."""
    try:
        yield future.result(), None, True
    except Exception as exc:
        yield None, exc, True


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
