"""``triton_python_backend_utils``: what a Triton ``model.py`` imports as ``pb_utils``.

The names and semantics follow Triton's python_backend (its README and
``triton_python_backend_utils.py``), written anew for an in-process server: tensors are numpy
arrays (no copy where none is needed), a request is one whole client request, and BLS calls
go to the same server's models through their own batchers (``InferenceRequest.exec``).

The engine registers this module as the top-level ``triton_python_backend_utils`` before it
imports a model (``engine.register_module``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from wattserve.engines.base import DATATYPE_TO_NUMPY, NUMPY_TO_DATATYPE
from wattserve.engines.python_backend import custom_metrics
from wattserve.engines.request_engines import ModelCaller

MODULE_NAME = "triton_python_backend_utils"

# Triton's response flags and request flags (TRITONSERVER_ResponseCompleteFlag, ..._RequestFlag)
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_log = logging.getLogger("wattserve.python_model")


# ---------------------------------------------------------------------------- errors


class TritonError(Exception):
    """An error a model puts in a response (``InferenceResponse(error=...)``) or raises.
    Codes are Triton's ``TRITONSERVER_Error_Code`` values."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    """What a model raises to fail its requests (Triton's name for it)."""

    def message(self) -> str:
        return str(self)


# ---------------------------------------------------------------------------- datatypes

# Triton config names (TYPE_*) -> numpy types, as its triton_string_to_numpy answers.
_CONFIG_TO_NUMPY: dict[str, Any] = {
    f"TYPE_{name}": dtype.type for name, dtype in DATATYPE_TO_NUMPY.items() if name != "BYTES"
}
_CONFIG_TO_NUMPY["TYPE_STRING"] = np.object_


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32``; ``"TYPE_STRING"`` -> ``np.object_``."""
    try:
        return _CONFIG_TO_NUMPY[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown Triton datatype {triton_type_string!r}") from None


def numpy_to_triton_type(dtype: Any) -> str | None:
    """A numpy dtype -> the protocol datatype name (``FP32``, ``BYTES``...), or None."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    return NUMPY_TO_DATATYPE.get(dt)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """Triton's length-prefixed serialization of a BYTES tensor, as a flat uint8 array."""
    out = bytearray()
    for value in np.asarray(input_tensor).flat:
        data = value if isinstance(value, bytes) else str(value).encode()
        out += len(data).to_bytes(4, "little") + data
    return np.frombuffer(bytes(out), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of ``serialize_byte_tensor``: an object array of bytes."""
    data = bytes(encoded_tensor)
    values, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 4], "little")
        values.append(data[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return np.array(values, dtype=object)


def as_bytes_array(value: np.ndarray) -> np.ndarray:
    """A BYTES tensor as the server carries it: an object array whose elements are bytes."""
    if value.dtype == object and all(isinstance(v, bytes) for v in value.flat):
        return value
    flat = [v if isinstance(v, bytes) else (v.encode() if isinstance(v, str) else str(v).encode())
            for v in value.flat]  # fmt: skip
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(value.shape)


# ---------------------------------------------------------------------------- tensors


class Tensor:
    """A named tensor on the CPU. ``as_numpy`` returns the array itself (no copy)."""

    def __init__(self, name: str, data: Any, dtype: Any = None) -> None:
        if not isinstance(name, str):
            raise TritonModelException("Tensor's first argument is its name (a str)")
        array = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        if array.dtype.kind == "U":  # strings are BYTES: stored as bytes, as Triton does
            array = as_bytes_array(array)
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> str | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the same memory (torch: ``torch.utils.dlpack.from_dlpack``)."""
        if self._array.dtype.kind in "OSU":
            raise TritonModelException(f"tensor {self._name!r} is BYTES; DLPack carries numbers only")
        return self._array.__dlpack__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """From a DLPack capsule or any object with ``__dlpack__`` (a torch tensor). GPU
        tensors are refused by name: this server's Python models run on the CPU."""
        device = getattr(dlpack_tensor, "__dlpack_device__", None)
        if device is not None and device()[0] != 1:
            raise TritonModelException(f"Tensor.from_dlpack({name!r}): a GPU tensor; wattserve runs Python "
                                       "models' tensors on the CPU (move it with .cpu())")  # fmt: skip
        if hasattr(dlpack_tensor, "__dlpack__"):
            return Tensor(name, np.from_dlpack(dlpack_tensor))
        try:  # a bare capsule: torch can read it
            import torch.utils.dlpack
        except ImportError:
            raise TritonModelException("Tensor.from_dlpack with a bare capsule needs torch") from None
        tensor = torch.utils.dlpack.from_dlpack(dlpack_tensor)
        if tensor.device.type != "cpu":
            raise TritonModelException(f"Tensor.from_dlpack({name!r}): a {tensor.device} tensor; wattserve "
                                       "runs Python models' tensors on the CPU")  # fmt: skip
        return Tensor(name, tensor.numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


# ---------------------------------------------------------------------------- responses


class InferenceResponse:
    """A request's answer: output tensors, or an error (``TritonError``)."""

    def __init__(
        self, output_tensors: Sequence[Tensor] | None = None, error: Any = None, parameters: Any = None
    ) -> None:
        self._outputs = list(output_tensors or [])
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# Sink(outputs or None, error or None, final): a front end's thread-safe consumer of a
# decoupled request's responses (the engine wires it from the request's context).
ResponseSink = Callable[[dict[str, np.ndarray] | None, TritonError | None, bool], None]


class InferenceResponseSender:
    """A decoupled model's way to answer: any number of responses, then the final flag."""

    def __init__(
        self, deliver: Callable[[InferenceResponse | None, int], None], cancelled: Callable[[], bool] = bool
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
        self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        """True once the client has gone: its call cancelled, its connection or stream
        closed (the request's own cancellation, or its response stream's)."""
        return bool(self._cancelled())

    @property
    def closed(self) -> bool:
        return self._closed


# ---------------------------------------------------------------------------- requests

_callers = threading.local()
_fallback: list[ModelCaller | None] = [None]


def bind_caller(caller: ModelCaller | None, *, thread_only: bool = False) -> None:
    """The door BLS calls from this thread use (the engine sets it on its thread; threads a
    model starts itself fall back to the last bound one)."""
    _callers.caller = caller
    if caller is not None and not thread_only:
        _fallback[0] = caller


def _caller() -> ModelCaller:
    caller = getattr(_callers, "caller", None) or _fallback[0]
    if caller is None:
        raise TritonModelException(
            "BLS is not available here: no server model is executing (wattserve binds a model's BLS "
            "door once its instances are built: BLS works from execute and threads it starts, not "
            "from initialize)"
        )
    return caller


class InferenceRequest:
    """One request: what ``execute`` gets (built by the engine) and what a BLS call builds
    (``InferenceRequest(model_name=..., inputs=[...], requested_output_names=[...])``)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] | None = None,
        requested_output_names: Sequence[str] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Any = None,
    ) -> None:
        self.model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._request_id = request_id or ""
        self._correlation_id = correlation_id
        self.model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = bool  # bool() is False: a BLS request's own

    # what a model asks of a request it executes
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        """True once the client that sent this request has gone (HTTP connection closed,
        gRPC call cancelled or past its deadline): its answer is discarded, so a model may
        stop early (Triton's "Request Cancellation Handling")."""
        return bool(self._cancelled())

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("get_response_sender: this model is not decoupled "
                                       "(model_transaction_policy { decoupled: true })")  # fmt: skip
        return self._sender

    # BLS
    def _call(self) -> Future[dict[str, np.ndarray]]:
        inputs = {t.name(): t.as_numpy() for t in self._inputs}
        version = None if self.model_version in (-1, "", None) else str(self.model_version)
        return _caller()(self.model_name, inputs, self._requested or None, version,
                         self._request_id or None, self._timeout or None)  # fmt: skip

    def exec(self, decoupled: bool = False) -> Any:
        """Run on model ``model_name`` of this server (its own batcher) and wait: an
        ``InferenceResponse`` (errors inside it, as Triton's BLS); with ``decoupled=True`` an
        iterator over every response the model sends, the final flag alone as an empty
        response (Triton's BLS iterator: check ``output_tensors()`` before reading)."""
        if decoupled:
            return ResponseIterator(self._stream())
        return _response(self._call())

    def async_exec(self, decoupled: bool = False) -> Any:
        """As ``exec``, awaitable from an ``async def execute``; with ``decoupled=True`` the
        awaited value is an iterator over the responses, gathered off this thread's loop."""
        if decoupled:

            async def gather() -> ResponseIterator:
                responses = await asyncio.get_running_loop().run_in_executor(None, list, self.exec(True))
                return ResponseIterator(iter(()), responses)

            return gather()
        future = asyncio.wrap_future(self._call())

        async def wait() -> Any:
            try:
                outputs = await future
            except Exception as exc:
                return InferenceResponse(error=_as_triton_error(exc))
            return InferenceResponse([Tensor(n, v) for n, v in outputs.items()])

        return wait()

    def _stream(self) -> Iterator[Any]:
        caller = _caller()
        inputs = {t.name(): t.as_numpy() for t in self._inputs}
        version = None if self.model_version in (-1, "", None) else str(self.model_version)
        args = (self.model_name, inputs, self._requested or None, version, self._request_id or None,
                self._timeout or None)  # fmt: skip
        stream = getattr(caller, "stream", None)
        if stream is not None:
            return stream(*args)
        return iter([(_outputs_or_error(caller(*args)), None, True)])


class ResponseIterator:
    """BLS ``exec(decoupled=True)``: the callee's responses in the order sent, each an
    ``InferenceResponse`` (an error inside one, as Triton's), ending after the final flag."""

    def __init__(self, events: Iterator[Any], ready: list[InferenceResponse] | None = None) -> None:
        self._events = events
        self._ready = list(ready or [])
        self._done = ready is not None

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._ready:
            return self._ready.pop(0)
        if self._done:
            raise StopIteration
        outputs, error, final = next(self._events)
        self._done = bool(final)
        if isinstance(outputs, BaseException):  # a caller without ``stream``: its one answer
            outputs, error = None, outputs
        if error is not None:
            return InferenceResponse(error=_as_triton_error(error))
        return InferenceResponse([Tensor(n, v) for n, v in (outputs or {}).items()])

    def cancel(self) -> None:
        """Triton's iterator can cancel the request; here the callee runs to its end."""


def _outputs_or_error(future: Future[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | BaseException:
    try:
        return future.result()
    except Exception as exc:
        return exc


def _as_triton_error(exc: BaseException) -> TritonError:
    status = getattr(exc, "status", None)
    code = getattr(TritonError, str(getattr(status, "value", "")), TritonError.INTERNAL)
    return TritonError(str(exc), code if isinstance(code, int) else TritonError.INTERNAL)


def _response(future: Future[dict[str, np.ndarray]]) -> InferenceResponse:
    try:
        outputs = future.result()
    except Exception as exc:
        return InferenceResponse(error=_as_triton_error(exc))
    return InferenceResponse([Tensor(name, value) for name, value in outputs.items()])


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


# ---------------------------------------------------------------------------- config


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("input", []) if c.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("output", []) if c.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the config (``json.loads(args["model_config"])``) makes the model decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# ---------------------------------------------------------------------------- logging


class Logger:
    """Triton's model logger, on Python logging (logger ``wattserve.python_model``)."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        levels = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
        _log.log(levels.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


class LogLevel:
    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3


# ---------------------------------------------------------------------------- custom metrics


class MetricKind(enum.IntEnum):
    COUNTER = custom_metrics.COUNTER
    GAUGE = custom_metrics.GAUGE
    HISTOGRAM = custom_metrics.HISTOGRAM


_LIFETIME = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
             "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
             "been deleted.")  # fmt: skip


class Metric:
    """One labelled series of a family (``MetricFamily.Metric(labels=..., buckets=...)``):
    ``increment`` (counter, gauge), ``set`` (gauge), ``observe`` (histogram), ``value``
    (counter, gauge); a misuse raises ``TritonModelException`` with Triton's message."""

    def __init__(self, store: custom_metrics.CustomMetrics, family: custom_metrics.Family,
                 series: custom_metrics.Series) -> None:  # fmt: skip
        self._store, self._family, self._series = store, family, series
        self._live = True
        self._lock = threading.Lock()

    def _op(self, name: str, *args: float) -> Any:
        if not self._live:
            raise TritonModelException(_LIFETIME)
        try:
            return getattr(self._store, name)(self._series, *(float(a) for a in args))
        except custom_metrics.MetricError as exc:
            raise TritonModelException(str(exc)) from None

    def increment(self, value: float) -> None:
        self._op("increment", value)

    def set(self, value: float) -> None:
        self._op("set", value)

    def observe(self, value: float) -> None:
        self._op("observe", value)

    def value(self) -> float:
        return float(self._op("value"))

    def _release(self) -> None:
        with self._lock:
            if not self._live:
                return
            self._live = False
        self._store.release_series(self._family, self._series)

    def __del__(self) -> None:
        self._release()


class MetricFamily:
    """Triton's custom metric family: ``MetricFamily(name, description, kind)`` with kind
    ``MetricFamily.COUNTER``, ``GAUGE`` or ``HISTOGRAM``, published on the server's
    /metrics under ``name`` (engines/python_backend/custom_metrics.py). The same name and
    kind again is the same family (its first description kept); another kind is an error."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: Any) -> None:
        self._live = False
        owner = custom_metrics.current_owner()
        try:
            self._family = owner.store.acquire_family(name, description, kind)
        except custom_metrics.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        self._store = owner.store
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._live = True
        owner.adopt(self)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if not self._live:
            raise TritonModelException(_LIFETIME)
        try:
            series = self._store.acquire_series(self._family, labels, buckets)
        except custom_metrics.MetricError as exc:
            raise TritonModelException(str(exc)) from None
        metric = Metric(self._store, self._family, series)
        self._metrics.add(metric)
        custom_metrics.current_owner().adopt(metric)
        return metric

    def _release(self) -> None:
        """Triton deletes a family's metrics with it: they answer the lifetime error after."""
        with self._lock:
            if not self._live:
                return
            self._live = False
        for metric in list(self._metrics):
            metric._release()
        self._store.release_family(self._family)

    def __del__(self) -> None:
        if getattr(self, "_live", False):
            self._release()
