"""KServe v2 (Open Inference Protocol) tensors <-> numpy, JSON and binary extension.

Everything here is validated before a request gets near a queue: a bad request gets a
400 with a message that says what was wrong, and never reaches a batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import rapidjson
from wattserve.batchers.status import Status
from wattserve.engines.base import DATATYPE_TO_NUMPY, TensorSpec
from wattserve.server import classification, shared_memory
from wattserve.server.bytes_tensors import (
    BYTES,
    bytes_from_json,
    bytes_from_values,
    bytes_to_json,
    deserialize_bytes,
    serialize_bytes,
)
from wattserve.server.shared_memory import SharedMemoryRegistry

BINARY_HEADER = "Inference-Header-Content-Length"
BINARY_HEADER_RAW = BINARY_HEADER.lower().encode()  # as an ASGI header list names it


class BadRequest(ValueError):
    """The client's fault; answered INVALID_ARG (or ``status``) with this message."""

    def __init__(self, message: str, status: Status = Status.INVALID_ARG) -> None:
        super().__init__(message)
        self.status = status


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
    else:
        output_regions = None
        classification = None
        response_sink = None
        token_sink = None
        response_cancelled = None
        parameters = None


def split_binary_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """Separate the JSON header from the binary tensor section (binary extension)."""
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise BadRequest(f"{BINARY_HEADER} must be an integer, got {header_length!r}") from None
    if not 0 <= n <= len(body):
        raise BadRequest(f"{BINARY_HEADER}={n} but the body has {len(body)} bytes")
    return body[:n], body[n:]


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    max_batch_size: int,
    check_values: bool = False,
    shm: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Decode and validate one KServe v2 infer request for a model with ``specs`` inputs.

    ``max_batch_size`` 0: the model does not batch (Triton), shapes carry no batch axis.
    NaN/Inf are computed like any other value (Triton parity: benchmarking clients send
    random bytes and NaN/Infinity tokens); ``check_values`` rejects them with a 400.

    Every malformed body is a BadRequest (400): a value of the wrong JSON type anywhere
    that the checks below did not foresee is still the client's fault, never a 500."""
    try:
        request = _parse_infer_request(
            body, header_length, specs, output_specs, max_batch_size, check_values, shm
        )
        if request.output_regions:
            shared_memory.check_output_regions(shm, request.output_regions)
        return request
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        raise BadRequest(f"malformed inference request: {exc}") from None


def _parse_infer_request(
    body: bytes,
    header_length: str | None,
    specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    max_batch_size: int,
    check_values: bool,
    shm: SharedMemoryRegistry | None = None,
) -> InferRequest:
    json_part, binary = split_binary_body(body, header_length)
    if header_length is not None and not json_part:  # Inference-Header-Content-Length: 0
        return parse_raw_request(binary, specs, output_specs, max_batch_size)
    doc = _loads(json_part)
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")

    by_name = {s.name: s for s in specs}
    arrays: dict[str, np.ndarray] = {}
    batched_flags: set[bool] = set()
    offset = 0
    for raw in raw_inputs:
        if not isinstance(raw, dict):
            raise BadRequest("each input must be an object with name, shape, datatype")
        name = raw.get("name")
        if not isinstance(name, str) or name not in by_name:
            raise BadRequest(f"unknown input {name!r}; expected {sorted(by_name)}")
        if name in arrays:
            raise BadRequest(f"input {name!r} given twice")
        spec = by_name[name]
        shape, batched = check_tensor_header(raw.get("shape"), raw.get("datatype"), spec, max_batch_size)
        params = raw.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"input {name!r}: parameters must be an object")
        if "shared_memory_region" in params:
            array = tensor_from_bytes(shared_memory.read_input(shm, name, raw, params), spec, shape)
        elif "binary_data_size" in params:
            size = params["binary_data_size"]
            if not _is_int(size) or size < 0 or offset + size > len(binary):
                raise BadRequest(f"input {name!r}: binary_data_size {size!r} beyond the body")
            array = tensor_from_bytes(binary[offset : offset + size], spec, shape)
            offset += size
        else:
            data = raw.get("data")
            array = bytes_from_json(data, spec.name, shape) if spec.datatype == BYTES else \
                tensor_from_values(data, spec, shape)  # fmt: skip
        if check_values:
            check_finite(name, array)
        arrays[name] = array
        batched_flags.add(batched)
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} unread bytes after the binary tensors")
    return assemble_request(_request_id(doc), arrays, batched_flags, by_name, doc.get("parameters"),
                            doc.get("outputs"), output_specs)  # fmt: skip


# ---------------------------------------------------------------- checks shared by every front end
# HTTP (JSON or binary) and gRPC (raw or typed contents) decode through these, so a request
# means the same and is refused with the same message whichever protocol carried it.


def parse_raw_request(
    data: bytes, specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec], max_batch_size: int
) -> InferRequest:
    """Triton's raw binary request (``Inference-Header-Content-Length: 0``): the whole body is
    the model's one input, its shape deduced from the config (a batch of one when the model
    batches; one -1 dimension from the byte count; a BYTES input is one element, the body
    itself). Every output comes back in the binary extension. Refusals in Triton's words."""
    if len(specs) != 1:
        raise BadRequest(f"Raw request must only have 1 input (found 1) to be deduced but got {len(specs)} "
                         "inputs in the model configuration")  # fmt: skip
    spec = specs[0]
    dims = list(spec.shape)
    if spec.datatype == BYTES:
        if dims != [1]:
            raise BadRequest(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
        array = np.empty(1, dtype=object)
        array[0] = bytes(data)
    else:
        variable = [i for i, d in enumerate(dims) if d < 0]
        if len(variable) > 1:
            raise BadRequest(f"The shape of the raw input '{spec.name}' can not be deduced because there "
                             "are more than one variable-sized dimension")  # fmt: skip
        if variable:
            row_bytes = math.prod(d for d in dims if d >= 0) * spec.dtype.itemsize
            if row_bytes == 0 or len(data) % row_bytes:
                raise BadRequest(f"raw input '{spec.name}': {len(data)} bytes are not a whole number of "
                                 f"{spec.datatype} elements of shape {dims}")  # fmt: skip
            dims[variable[0]] = len(data) // row_bytes
        array = tensor_from_bytes(data, spec, dims)
    batched = max_batch_size > 0
    shaped = array.reshape([1, *dims] if batched else dims)
    request = InferRequest(id=None, inputs={spec.name: shaped}, batched=batched, rows=1)
    request.binary_outputs = {s.name for s in output_specs}
    return request


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


MAX_JSON_DEPTH = 100  # Triton's HTTP front end refuses request JSON nested deeper than this
DEPTH_MESSAGE = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"  # Triton's words
# NaN/Infinity/-Infinity as floats (NM_NAN), numbers through C's own conversions (NM_NATIVE):
# python-rapidjson's fastest mode, near orjson's speed (docs/benchmarks.md, "random data")
_RAPIDJSON_MODE = rapidjson.NM_NAN | rapidjson.NM_NATIVE
_PEEK_BYTES = 64 * 1024  # random FP32 data holds a NaN within ~6 KB on average
_COUNT_BYTES = 16 * 1024  # counting a 3.3 MB body's brackets took 1.8 ms, a fifth of orjson's parse


def _loads(text: bytes) -> Any:
    """orjson (fast), or python-rapidjson for a body holding NaN, Infinity or -Infinity
    tokens (not JSON, but clients write them: perf_analyzer's random data does), which
    orjson refuses; rapidjson takes them at about orjson's speed, where Python's json took
    5x as long holding the GIL the engine thread needs. A token in the first _PEEK_BYTES
    goes straight to rapidjson (random data has one within a few KB), saving orjson's failed
    try (it checks the whole body's UTF-8 first: 2.5 ms of a 3.3 MB body). Either way
    nesting deeper than Triton's limit is refused."""
    if len(text) > _PEEK_BYTES and _has_token(text, _PEEK_BYTES):  # a small body: orjson's try is cheap
        doc = _loads_with_tokens(text)
    else:
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if not _has_token(text, len(text)):
                raise BadRequest(_json_error(str(exc))) from None
            doc = _loads_with_tokens(text)
    # A small body with too few brackets cannot nest that deep (two byte counts, far cheaper
    # than the walk); past _COUNT_BYTES the walk, which visits containers only, is the cheaper.
    if len(text) > _COUNT_BYTES or text.count(b"[") + text.count(b"{") > MAX_JSON_DEPTH:
        check_depth(doc)
    return doc


def _has_token(text: bytes, end: int) -> bool:
    """Whether ``text[:end]`` holds NaN or Infinity (searched in place, no copy)."""
    return text.find(b"NaN", 0, end) >= 0 or text.find(b"Infinity", 0, end) >= 0


def _loads_with_tokens(text: bytes) -> Any:
    try:
        return rapidjson.loads(text, number_mode=_RAPIDJSON_MODE)
    except (ValueError, RecursionError) as exc:  # rapidjson.JSONDecodeError is a ValueError
        raise BadRequest(_json_error(str(exc))) from None


def _json_error(message: str) -> str:
    """A parser's refusal in the client's words: Triton's for nesting (both parsers refuse
    past their own depth limits, ~1000 levels), else the parser's own."""
    if "depth" in message:
        return DEPTH_MESSAGE
    return f"malformed JSON: {message}"


def check_depth(doc: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse a parsed document nested deeper than ``limit`` (Triton's L0_http behaviour).

    Walks containers only: a list whose first element is not a container is taken as a
    list of values (tensor data), and its other elements are not visited, so a flat tensor
    of 150k numbers costs one look, not 150k. A deep list hidden behind a scalar first
    element is left to the checks that follow (tensor data must be numbers of one shape)."""
    level: list[Any] = [doc]
    depth = 0
    while level:
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                below.extend(v for v in node.values() if isinstance(v, dict | list))
            elif node and isinstance(node[0], dict | list):
                below.extend(v for v in node if isinstance(v, dict | list))
        depth += 1
        if depth > limit:
            raise BadRequest(DEPTH_MESSAGE)
        level = below


def _is_int(value: Any) -> bool:
    """A JSON integer: JSON's true/false are not sizes, dims or priorities."""
    return isinstance(value, int) and not isinstance(value, bool)


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("'id' must be a string")
    return rid


MAX_ELEMENTS = 2**63 - 1  # Triton's bound on a tensor's element count (and byte size)


def check_shape(shape: Any, spec: TensorSpec, max_batch_size: int) -> tuple[list[int], bool]:
    """Triton's rule: a batching model's inputs carry the batch axis first (1..max), a
    non-batching model's do not; every other dimension as the spec says, -1 any size."""
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
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
        if not _is_int(p) or p < 0:
            raise BadRequest("parameter 'priority' must be a non-negative integer")
        request.priority = p
    if "timeout" in params:  # Triton: microseconds
        t = params["timeout"]
        if not _is_int(t) or t < 0:
            raise BadRequest("parameter 'timeout' must be a non-negative integer (microseconds)")
        request.timeout_us = t or None
    if params.get("binary_data_output") is True:
        request.binary_outputs = {"*"}


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
            raise BadRequest(f"unknown output {name!r}; model has {sorted(known)}")
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
    (``server.classification``), labelled from ``labels``."""
    names = request.outputs or [s.name for s in output_specs]
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


def _has_nonfinite(tensors: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(data := t.get("data"), np.ndarray)
        and data.dtype.kind == "f"
        and not np.isfinite(data).all()
        for t in tensors
    )


def encode_infer_response(
    model_name: str,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    output_specs: Sequence[TensorSpec],
    version: str = "1",
    shm: SharedMemoryRegistry | None = None,
    labels: classification.ClassLabels | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Body and extra headers (binary extension) for one answered request."""
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    arrays = output_arrays(request, outputs, output_specs, labels)
    in_shm = (
        shared_memory.write_outputs(shm, request.output_regions, arrays) if request.output_regions else ()
    )
    for name, datatype, value in arrays:
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(value.shape)}
        if name in in_shm:  # written to its region: metadata only (Triton)
            pass
        elif name in request.binary_outputs:
            blob = tensor_bytes(datatype, value)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == BYTES:
            tensor["data"] = bytes_to_json(value)
        else:  # orjson has no bfloat16: BF16 goes out as the FP32 numbers it holds exactly
            tensor["data"] = value.astype(np.float32).ravel() if datatype == "BF16" else value.ravel()
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": version, "outputs": tensors}
    if request.id is not None:
        doc["id"] = request.id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in header and _has_nonfinite(tensors):
        # orjson writes NaN/Inf as null; Triton writes NaN/Infinity tokens, and so do we.
        for tensor in tensors:
            if isinstance(tensor.get("data"), np.ndarray):
                tensor["data"] = tensor["data"].tolist()
        header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return header, {}
    return header + b"".join(blobs), {BINARY_HEADER: str(len(header))}
