"""KServe v2 gRPC messages <-> the requests and answers the admission path knows.

Inputs arrive as ``raw_input_contents`` (one little-endian blob per input, what Triton's
clients send) or as the typed ``contents`` fields; both go through the same checks as HTTP
(``server.http.codec``: shape, datatype, batch size, element count, the NaN/Inf value check,
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
from wattserve.server.core.request import (
    BadRequest,
    InferRequest,
    assemble_request,
    check_finite,
    check_tensor_header,
    output_arrays,
    tensor_bytes,
    tensor_from_bytes,
    tensor_from_values,
)
from wattserve.server.extensions import shared_memory
from wattserve.server.extensions.classification import ClassLabels

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
            if field == "bytes_contents":
                size += sum(4 + len(v) for v in tensor.contents.bytes_contents)
            elif field is not None:
                size += 8 * len(getattr(tensor.contents, field))
    return size


def parse_grpc_request(
    message: service_pb2.ModelInferRequest,
    specs: Sequence[TensorSpec],
    output_specs: Sequence[TensorSpec],
    max_batch_size: int,
    check_values: bool = False,
    shm: shared_memory.SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Decode and validate one ModelInferRequest for a model with ``specs`` inputs; every
    problem is a BadRequest (INVALID_ARGUMENT) with the message HTTP would give."""
    if not message.inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    raw = message.raw_input_contents
    in_shm = sum("shared_memory_region" in t.parameters for t in message.inputs)
    if raw and len(raw) != len(message.inputs) - in_shm:
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs) - in_shm} inputs; "
            "send raw contents for every input or for none"
        )
    by_name = {s.name: s for s in specs}
    arrays: dict[str, np.ndarray] = {}
    batched_flags: set[bool] = set()
    index = 0  # into raw_input_contents, which has no entry for a shared-memory input
    for tensor in message.inputs:
        name = tensor.name
        if name not in by_name:
            raise BadRequest(f"unknown input {name!r}; expected {sorted(by_name)}")
        if name in arrays:
            raise BadRequest(f"input {name!r} given twice")
        spec = by_name[name]
        shape, batched = check_tensor_header(list(tensor.shape), tensor.datatype, spec, max_batch_size)
        if in_shm and "shared_memory_region" in tensor.parameters:
            params = {k: parameter_value(v) for k, v in tensor.parameters.items()}
            if tensor.HasField("contents"):
                raise BadRequest(
                    f"unexpected 'content' provided when using shared memory for input tensor {name!r}"
                )
            array = tensor_from_bytes(shared_memory.read_region(shm, name, params), spec, shape)
        elif raw:
            if tensor.HasField("contents"):
                raise BadRequest(f"input {name!r} has both contents and raw_input_contents")
            array = tensor_from_bytes(raw[index], spec, shape)
            index += 1
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
    request = assemble_request(message.id or None, arrays, batched_flags, by_name, parameters, outputs,
                               output_specs)  # fmt: skip
    if request.output_regions:
        shared_memory.check_output_regions(shm, request.output_regions)
    return request


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
    outputs: dict[str, np.ndarray],
    output_specs: Sequence[TensorSpec],
    shm: shared_memory.SharedMemoryRegistry | None = None,
    labels: ClassLabels | None = None,
) -> service_pb2.ModelInferResponse:
    """One answered request as a ModelInferResponse, outputs as raw little-endian bytes."""
    response = service_pb2.ModelInferResponse(model_name=model_name, model_version=version,
                                              id=request.id or "")  # fmt: skip
    arrays = output_arrays(request, outputs, output_specs, labels)
    in_shm = (
        shared_memory.write_outputs(shm, request.output_regions, arrays) if request.output_regions else ()
    )
    for name, datatype, value in arrays:
        tensor = response.outputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(value.shape)
        # an output written to shared memory has an empty entry (Triton: one per output)
        response.raw_output_contents.append(b"" if name in in_shm else tensor_bytes(datatype, value))
    return response
