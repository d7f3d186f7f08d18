"""KServe v2 (Open Inference Protocol) tensors <-> numpy, JSON and binary extension.

Everything here is validated before a request gets near a queue: a bad request gets a
400 with a message that says what was wrong, and never reaches a batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import rapidjson
from wattserve.engines.base import TensorSpec
from wattserve.server.core.bytes_tensors import (
    BYTES,
    bytes_from_json,
    bytes_to_json,
)
from wattserve.server.core.request import (
    BadRequest,
    InferRequest,
    assemble_request,
    check_finite,
    check_tensor_header,
    is_int,
    output_arrays,
    tensor_bytes,
    tensor_from_bytes,
    tensor_from_values,
)
from wattserve.server.extensions import classification, shared_memory
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry

BINARY_HEADER = "Inference-Header-Content-Length"
BINARY_HEADER_RAW = BINARY_HEADER.lower().encode()  # as an ASGI header list names it


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


# The HTTP front end's payload for the decoder (server.core.decode.Parse): the body and its
# Inference-Header-Content-Length (None: all JSON).
InferBody = tuple[bytes, str | None]


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    max_batch_size: int,
    check_values: bool = False,
    shm: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """``parse_infer_body`` with the body and its header length given apart."""
    return parse_infer_body((body, header_length), specs, output_specs, max_batch_size, check_values, shm)


def parse_infer_body(
    payload: InferBody,
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
    body, header_length = payload
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
            if not is_int(size) or size < 0 or offset + size > len(binary):
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


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("'id' must be a string")
    return rid


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
