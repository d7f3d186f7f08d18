"""The protocol-neutral request both front ends decode into, and the checks they share.

``InferRequest`` is one validated request from here to its answer; ``BadRequest`` is the
client's fault in any protocol. HTTP (JSON or binary, server/http/codec.py) and gRPC (raw or
typed contents, server/grpc/codec.py) decode through these checks, so a request means the
same and is refused with the same message whichever protocol carried it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from wattserve.batchers.status import Status
from wattserve.batchers.types import SequenceTag
from wattserve.engines.base import DATATYPE_TO_NUMPY, TensorSpec
from wattserve.server.core.bytes_tensors import BYTES, bytes_from_values, deserialize_bytes, serialize_bytes
from wattserve.server.extensions import classification, shared_memory


class BadRequest(ValueError):
    """The client's fault; answered INVALID_ARG (or ``status``) with this message."""

    def __init__(self, message: str, status: Status = Status.INVALID_ARG) -> None:
        super().__init__(message)
        self.status = status


class UnknownOutput(BadRequest):
    """A requested output the model does not have; the decoder, which knows the model, says
    so in Triton's words (``for_model``)."""

    def __init__(self, name: object, known: Sequence[str]) -> None:
        super().__init__(f"unknown output {name!r}; model has {sorted(known)}")
        self.name = name

    def for_model(self, model: str) -> BadRequest:
        return BadRequest(f"unexpected inference output '{self.name}' for model '{model}'")


@dataclass
class InferRequest:
    """A validated request: its whole input tensors, scheduling parameters, output choices.

    One request stays one unit from here to its answer (Triton never splits a request):
    ``inputs`` keep the client's batch axis when the model batches (``rows`` rows each),
    and a non-batching model's tensors are as the client sent them (``rows`` 1)."""

    id: str | None
    inputs: dict[str, np.ndarray]
    batched: bool  # whether the tensors carry a batch axis (the model batches)
    rows: int = 1
    priority: int = 0  # Triton: 0 = the default level
    timeout_us: int | None = None
    outputs: list[str] | None = None  # None = all outputs
    binary_outputs: set[str] = field(default_factory=set)
    # outputs to write into shared memory: name -> (region, offset, byte_size)
    # Not fields: set only on the requests that use them (as fields, every request paid for
    # them in __init__): outputs written to shared memory, name -> (region, offset,
    # byte_size), and outputs asked for as classes, name -> K.
    # The checker sees instance attributes (not in __init__); at run time they are class
    # defaults that an instance shadows when it sets them.
    if TYPE_CHECKING:
        output_regions: dict[str, tuple[str, int, int]] | None = field(default=None, init=False)
        classification: dict[str, int] | None = field(default=None, init=False)
        # a decoupled model's response stream (server/core/decoupled.py), set by gRPC streaming
        response_sink: Any = field(default=None, init=False)
        # a language model's token stream (engines/lm_engine.py TokenSink), set by streaming routes
        token_sink: Any = field(default=None, init=False)
        # whether that stream's client has gone (ResponseStream.is_cancelled), set with it
        response_cancelled: Any = field(default=None, init=False)
        # the request's own parameters, Triton's reserved keys left out (what a Python model's
        # ``request.parameters()`` answers); set only when the request has some
        parameters: dict[str, Any] | None = field(default=None, init=False)
        # a stateful model's request: its correlation ID and START/END flags (``sequence_*``)
        sequence: SequenceTag | None = field(default=None, init=False)
    else:
        output_regions = None
        classification = None
        response_sink = None
        token_sink = None
        response_cancelled = None
        parameters = None
        sequence = None


def check_tensor_header(
    shape: Any, datatype: Any, spec: TensorSpec, max_batch_size: int
) -> tuple[list[int], bool]:
    """Shape (the batch axis first when the model batches, batch within 1..max; -1 dims
    of the spec take any size) and datatype of one input. Returns the shape and whether
    it carries the batch axis."""
    shape, batched = check_shape(shape, spec, max_batch_size)
    if datatype != spec.datatype:
        raise BadRequest(f"input {spec.name!r} has datatype {datatype!r}; model expects {spec.datatype}")
    return shape, batched


def tensor_from_bytes(chunk: bytes, spec: TensorSpec, shape: list[int]) -> np.ndarray:
    """An input's raw bytes (binary extension, gRPC raw contents), size-checked: numbers
    little-endian, BYTES elements each behind a 4-byte little-endian length."""
    if spec.datatype == BYTES:
        return deserialize_bytes(chunk, spec.name, shape)
    expected = math.prod(shape) * spec.dtype.itemsize
    if len(chunk) != expected:
        raise BadRequest(
            f"input {spec.name!r}: {len(chunk)} bytes for shape {shape} of {spec.datatype} "
            f"({expected} expected)"
        )
    return np.frombuffer(chunk, dtype=spec.dtype).reshape(shape)


def tensor_from_values(data: Any, spec: TensorSpec, shape: list[int]) -> np.ndarray:
    """An input given as a (nested) sequence of values: JSON data, gRPC typed contents."""
    if spec.datatype == BYTES:
        return bytes_from_values(data, spec.name, shape)
    return _from_json_data(data, spec, shape, math.prod(shape))


def check_finite(name: str, array: np.ndarray) -> None:
    """The value check a model may ask for (``check_values``): no NaN or Inf in float inputs."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise BadRequest(f"input {name!r} contains NaN or Inf, which this model's value check refuses")


def assemble_request(
    request_id: str | None,
    arrays: dict[str, np.ndarray],
    batched_flags: set[bool],
    by_name: dict[str, TensorSpec],
    parameters: Any,
    outputs: Any,
    output_specs: Sequence[TensorSpec],
) -> InferRequest:
    """Checked inputs -> one InferRequest: every input present, one batch size, parameters
    (priority, timeout in µs) and requested outputs read as the protocol says."""
    missing = set(by_name) - set(arrays)
    if missing:
        _refuse_missing(missing, by_name)
    batched = batched_flags.pop()
    sizes = {a.shape[0] for a in arrays.values()} if batched else {1}
    if len(sizes) > 1:
        raise BadRequest(f"inputs disagree on the batch size: {sorted(sizes)}")
    request = InferRequest(id=request_id, inputs=arrays, batched=batched, rows=sizes.pop())
    _read_parameters(parameters, request)
    _read_outputs(outputs, output_specs, request)
    return request


def _refuse_missing(missing: set[str], by_name: dict[str, TensorSpec]) -> None:
    """400 for a required input left out (Triton's ``optional`` inputs may be)."""
    required = sorted(name for name in missing if not by_name[name].optional)
    if required:
        raise BadRequest(f"missing input(s) {required}")


def is_int(value: Any) -> bool:
    """A JSON integer: JSON's true/false are not sizes, dims or priorities."""
    return isinstance(value, int) and not isinstance(value, bool)


MAX_ELEMENTS = 2**63 - 1  # Triton's bound on a tensor's element count (and byte size)


def check_shape(shape: Any, spec: TensorSpec, max_batch_size: int) -> tuple[list[int], bool]:
    """Triton's rule: a batching model's inputs carry the batch axis first (1..max), a
    non-batching model's do not; every other dimension as the spec says, -1 any size."""
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        raise BadRequest(f"input {spec.name!r}: shape must be a list of non-negative integers")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:  # Triton's words (its QA checks them)
        raise BadRequest(f"input '{spec.name}' has shape {shape} which causes total element count to exceed "
                         f"maximum size of {MAX_ELEMENTS}")  # fmt: skip
    if spec.datatype != BYTES and count * spec.dtype.itemsize > MAX_ELEMENTS:
        raise BadRequest(f"byte size overflow for input '{spec.name}': shape {shape} of {spec.datatype}")
    if max_batch_size == 0:  # Triton's max_batch_size 0: no batch axis in request shapes
        if not spec.accepts(shape):
            raise BadRequest(f"unexpected shape for input {spec.name!r} for model: expected "
                             f"{list(spec.shape)}, got {shape} (this model does not batch: no batch "
                             "axis)")  # fmt: skip
        return shape, False
    if not shape or not spec.accepts(shape[1:]):
        raise BadRequest(f"unexpected shape for input {spec.name!r} for model: expected "
                         f"{[-1, *spec.shape]}, got {shape}")  # fmt: skip
    if not 1 <= shape[0] <= max_batch_size:
        raise BadRequest(f"inference request batch-size must be <= {max_batch_size} for input "
                         f"{spec.name!r}, got {shape[0]}")  # fmt: skip
    return shape, True


def _from_json_data(data: Any, spec: TensorSpec, shape: list[int], count: int) -> np.ndarray:
    if data is None:
        raise BadRequest(f"input {spec.name!r} has neither 'data' nor binary_data_size")
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, caught below
            array = np.asarray(data, dtype=spec.dtype)
    except (ValueError, TypeError, OverflowError):
        raise BadRequest(f"input {spec.name!r}: data is not a list of {spec.datatype} numbers") from None
    if array.size != count:
        raise BadRequest(f"input {spec.name!r}: {array.size} elements for shape {shape} ({count} expected)")
    return array.reshape(shape)


# Request parameters Triton reads itself and never hands a model (its HTTP and gRPC front
# ends: sequence_*, priority, timeout, binary_data_output; keys starting ``triton_`` are
# Triton's, refused unless it knows them).
RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
)
# the ``triton_`` keys a client may send (gRPC streaming's empty final response)
TRITON_PARAMETERS = frozenset(("triton_enable_empty_final_response",))


def _read_parameters(params: Any, request: InferRequest) -> None:
    if params is None:
        return
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    if len(params) > len(RESERVED_PARAMETERS.intersection(params)):
        request.parameters = _model_parameters(params)
    if "priority" in params:
        p = params["priority"]
        if not is_int(p) or p < 0:
            raise BadRequest("parameter 'priority' must be a non-negative integer")
        request.priority = p
    if "timeout" in params:  # Triton: microseconds
        t = params["timeout"]
        if not is_int(t) or t < 0:
            raise BadRequest("parameter 'timeout' must be a non-negative integer (microseconds)")
        request.timeout_us = t or None
    if params.get("binary_data_output") is True:
        request.binary_outputs = {"*"}
    if "sequence_id" in params:
        request.sequence = _sequence(params)


UINT64 = 2**64


def _sequence(params: dict[str, Any]) -> SequenceTag | None:
    """Triton's sequence parameters: a correlation ID (an unsigned 64-bit integer or a
    string; 0 and "" mean none) and the START/END flags. gRPC carries an ID over 2^63 as a
    negative int64 (Triton reads the bits as uint64)."""
    cid = params["sequence_id"]
    if is_int(cid) and -(2**63) <= cid < UINT64:
        cid %= UINT64
    elif not isinstance(cid, str):
        raise BadRequest("parameter 'sequence_id' must be an unsigned 64-bit integer or a string")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise BadRequest(f"parameter '{key}' must be a boolean")
        flags.append(value)
    if cid == 0 or cid == "":
        return None
    return SequenceTag(cid, start=flags[0], end=flags[1])


def _model_parameters(params: dict[str, Any]) -> dict[str, Any] | None:
    """The parameters a model sees: every key but the reserved ones; values a string, an
    integer, a number or a boolean (Triton's words for anything else)."""
    kept: dict[str, Any] = {}
    for key, value in params.items():
        if key in RESERVED_PARAMETERS:
            continue
        if key.startswith("triton_"):
            if key in TRITON_PARAMETERS:
                continue
            raise BadRequest("parameter keys starting with 'triton_' are reserved for Triton usage and "
                             "should not be specified.")  # fmt: skip
        if not isinstance(value, str | int | float):  # bool is an int
            raise BadRequest(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', "
                             "or 'string'.")  # fmt: skip
        kept[key] = value
    return kept or None


def _read_outputs(outputs: Any, specs: Sequence[TensorSpec], request: InferRequest) -> None:
    known = {s.name for s in specs}
    if outputs is None:
        if "*" in request.binary_outputs:
            request.binary_outputs = set(known)
        return
    if not isinstance(outputs, list):
        raise BadRequest("'outputs' must be a list")
    names: list[str] = []
    binary = set(known) if "*" in request.binary_outputs else set()
    for out in outputs:
        name = out.get("name") if isinstance(out, dict) else None
        if not isinstance(name, str) or name not in known:
            raise UnknownOutput(name, sorted(known))
        if name in names:  # Triton's words
            raise BadRequest(f"output '{name}' already exists in request")
        names.append(name)
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise BadRequest(f"output {name!r}: parameters must be an object")
        region = shared_memory.output_region(name, out_params)
        if region is not None:
            request.output_regions = {**(request.output_regions or {}), name: region}
        wants = out_params.get("binary_data")
        if wants is True:
            binary.add(name)
        elif wants is False:
            binary.discard(name)
        if classification.PARAMETER in out_params:  # the classification extension
            _read_classification(name, out_params[classification.PARAMETER], specs, request)
    request.outputs = names
    request.binary_outputs = binary


def _read_classification(name: str, value: Any, specs: Sequence[TensorSpec], request: InferRequest) -> None:
    spec = next(s for s in specs if s.name == name)
    known = spec.element_count if all(d >= 0 for d in spec.shape) else None
    try:
        count = classification.class_count(name, value)
        request.classification = {**(request.classification or {}), name: count}
        classification.check_classifiable(name, spec.datatype, known)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def output_arrays(
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    output_specs: Sequence[TensorSpec],
    labels: classification.ClassLabels | None = None,
) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, contiguous array) of each requested output: the request's own rows,
    with the batch axis when the request had one; an output asked for as classes is BYTES
    (``server.extensions.classification``), labelled from ``labels``. An output the model
    did not produce (a Python model may leave one out, as in Triton) is not answered."""
    names = [n for n in request.outputs or [s.name for s in output_specs] if n in outputs]
    datatypes = {s.name: s.datatype for s in output_specs}
    out = []
    for name in names:
        value = outputs[name] if request.batched else outputs[name][0]
        value = np.ascontiguousarray(value, dtype=DATATYPE_TO_NUMPY[datatypes[name]])
        if request.classification and name in request.classification:
            k, class_names = request.classification[name], labels.get(name) if labels else None
            out.append((name, "BYTES", classification.top_k_strings(value, k, class_names, request.batched)))
            continue
        out.append((name, datatypes[name], value))
    return out


def tensor_bytes(datatype: str, value: np.ndarray) -> bytes:
    """An output's raw bytes as the binary extension and gRPC's raw contents carry them."""
    return serialize_bytes(value) if datatype == BYTES else value.tobytes()
