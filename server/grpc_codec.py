"""KServe v2 gRPC messages <-> the requests and answers the admission path knows.

Inputs arrive as ``raw_input_contents`` (one little-endian blob per input, what Triton's
clients send) or as the typed ``contents`` fields; both go through the same checks as HTTP
(``server.codec``: shape, datatype, batch size, element count, the NaN/Inf value check,
priority and timeout parameters), so a request means the same and is refused with the same
message whichever protocol carried it. Outputs go back as ``raw_output_contents``, as
Triton's server answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2
from wattserve.engines.base import TensorSpec
from wattserve.server.classification import ClassLabels
from wattserve.server.codec import (
    BadRequest,
    InferRequest,
    assemble_request,
    bytes_tensor_blob,
    check_finite,
    check_tensor_header,
    output_arrays,
    tensor_from_bytes,
    tensor_from_values,
)

# KServe v2: which typed field of InferTensorContents carries each datatype
# (FP16 and BF16 have none: they travel only as raw bytes).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(param: Any) -> Any:
    """An InferParameter's value as the JSON protocol would carry it (None when unset)."""
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def payload_bytes(message: service_pb2.ModelInferRequest) -> int:
    """About how many bytes decoding ``message`` holds (what the shared body budget counts):
    the raw blobs exactly, typed contents at 8 bytes an element. Cheap: no serialization."""
    size = sum(len(blob) for blob in message.raw_input_contents)
    for tensor in message.inputs:
        if tensor.HasField("contents"):
            field = CONTENTS_FIELD.get(tensor.datatype)
            if field is not None:
                size += 8 * len(getattr(tensor.contents, field))
    return size


def parse_grpc_request(
    message: service_pb2.ModelInferRequest,
    specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    max_batch_size: int,
    check_values: bool = False,
) -> InferRequest:
    """Decode and validate one ModelInferRequest for a model with ``specs`` inputs; every
    problem is a BadRequest (INVALID_ARGUMENT) with the message HTTP would give."""
    if not message.inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; "
            "send raw contents for every input or for none"
        )
    by_name = {s.name: s for s in specs}
    arrays: dict[str, np.ndarray] = {}
    batched_flags: set[bool] = set()
    for index, tensor in enumerate(message.inputs):
        name = tensor.name
        if name not in by_name:
            raise BadRequest(f"unknown input {name!r}; expected {sorted(by_name)}")
        if name in arrays:
            raise BadRequest(f"input {name!r} given twice")
        spec = by_name[name]
        shape, batched = check_tensor_header(list(tensor.shape), tensor.datatype, spec, max_batch_size)
        if raw:
            if tensor.HasField("contents"):
                raise BadRequest(f"input {name!r} has both contents and raw_input_contents")
            array = tensor_from_bytes(raw[index], spec, shape)
        else:
            array = _from_contents(tensor, spec, shape)
        if check_values:
            check_finite(name, array)
        arrays[name] = array
        batched_flags.add(batched)
    parameters = {key: parameter_value(value) for key, value in message.parameters.items()}
    outputs = None
    if message.outputs:
        outputs = [
            {"name": o.name, "parameters": {k: parameter_value(v) for k, v in o.parameters.items()}}
            for o in message.outputs
        ]
    return assemble_request(message.id or None, arrays, batched_flags, by_name, parameters, outputs,
                            output_specs)  # fmt: skip


def _from_contents(tensor: Any, spec: TensorSpec, shape: list[int]) -> np.ndarray:
    field = CONTENTS_FIELD.get(spec.datatype)
    if field is None:
        raise BadRequest(f"input {spec.name!r}: {spec.datatype} travels only in raw_input_contents")
    if not tensor.HasField("contents"):
        raise BadRequest(f"input {spec.name!r} has neither contents nor raw_input_contents")
    return tensor_from_values(getattr(tensor.contents, field), spec, shape)


def build_response(
    model_name: str,
    version: str,
    request: InferRequest,
    rows: list[dict[str, np.ndarray]],
    output_specs: Sequence[TensorSpec],
    labels: ClassLabels | None = None,
) -> service_pb2.ModelInferResponse:
    """One answered request as a ModelInferResponse, outputs as raw little-endian bytes."""
    response = service_pb2.ModelInferResponse(model_name=model_name, model_version=version,
                                              id=request.id or "")  # fmt: skip
    for name, datatype, value in output_arrays(request, rows, output_specs, labels):
        tensor = response.outputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(value.shape)
        response.raw_output_contents.append(
            bytes_tensor_blob(value) if datatype == "BYTES" else value.tobytes()
        )
    return response
