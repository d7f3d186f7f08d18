"""In-process inference: one model of this server calling another without a protocol.

Ensembles (a step's model) and Python models (BLS ``pb_utils.InferenceRequest.exec``) reach
the other models of the same server here. The call takes the same path a front end's request
takes (``admission.admit``: lookup, readiness, queue room, validation, the model's own batcher),
so an in-process call batches with external requests and is counted in the model's
statistics; it only skips the wire: tensors stay numpy arrays, no copy where none is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from wattserve.engines.base import Engine
from wattserve.server.core.admission import admit
from wattserve.server.core.request import BadRequest, InferRequest, check_shape
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime


def request_from_arrays(
    runtime: ModelRuntime,
    engine: Engine,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    request_id: str | None = None,
    priority: int = 0,
    timeout_us: int | None = None,
) -> InferRequest:
    """Arrays -> an InferRequest checked as a front end checks a decoded one (BadRequest:
    an unknown or missing input, a wrong shape or datatype, an unknown output).

    The arrays follow Triton's shape rule: a batching model's inputs carry the batch axis."""
    by_name = {spec.name: spec for spec in engine.inputs}
    unknown = sorted(set(inputs) - set(by_name))
    if unknown:
        raise BadRequest(f"unexpected input(s) {unknown} for model {runtime.name!r}")
    missing = sorted(name for name, spec in by_name.items() if name not in inputs and not spec.optional)
    if missing:  # an optional input may be left out (Triton's: an ensemble step's, a BLS request's)
        raise BadRequest(f"missing input(s) {missing} for model {runtime.name!r}")
    arrays: dict[str, np.ndarray] = {}
    batched = runtime.request_max_batch > 0
    for name, spec in by_name.items():
        if name not in inputs:
            continue
        value = np.asarray(inputs[name])
        if spec.datatype == "BYTES":
            if value.dtype != object:  # str/bytes numpy arrays -> object array of bytes
                value = (
                    np.vectorize(_as_bytes, otypes=[object])(value) if value.size else value.astype(object)
                )
        elif value.dtype != spec.dtype:
            raise BadRequest(f"input {name!r} of model {runtime.name!r}: datatype {value.dtype} where the "
                             f"model takes {spec.datatype}")  # fmt: skip
        check_shape(list(value.shape), spec, runtime.request_max_batch)
        arrays[name] = value
    sizes = {a.shape[0] for a in arrays.values()} if batched else {1}
    if len(sizes) > 1:
        raise BadRequest(f"inputs disagree on the batch size: {sorted(sizes)}")
    known_outputs = {spec.name for spec in engine.outputs}
    wanted = list(outputs) if outputs else None
    if wanted is not None and not set(wanted) <= known_outputs:
        raise BadRequest(f"unknown output(s) {sorted(set(wanted) - known_outputs)} of model {runtime.name!r}")
    rows = sizes.pop() if sizes else 1
    request = InferRequest(id=request_id, inputs=arrays, batched=batched, rows=rows, outputs=wanted)
    request.priority = priority
    request.timeout_us = timeout_us
    return request


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


async def infer_in_process(
    models: ModelSet,
    name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    version: str | None = None,
    outputs: Sequence[str] | None = None,
    request_id: str | None = None,
    priority: int = 0,
    timeout_us: int | None = None,
) -> dict[str, np.ndarray]:
    """Run one request on model ``name`` through its batcher; its requested outputs (all by
    default), each with the batch axis when the model batches.

    Raises ``admission.Refused`` (with a neutral status kind) exactly where a front end's
    request would be refused or fail."""

    async def decode(runtime: ModelRuntime, _source: Any) -> tuple[InferRequest, Engine | None]:
        engine = runtime.engine
        if engine is None:
            raise BadRequest(f"model {name!r} is unloading")
        return request_from_arrays(runtime, engine, inputs, outputs, request_id, priority, timeout_us), engine

    admitted = await admit(models, name, version, decode, None)
    request, result = admitted.request, admitted.result
    names = request.outputs or [spec.name for spec in (admitted.engine.outputs if admitted.engine else ())]
    if not names:
        names = list(result.outputs)
    names = [n for n in names if n in result.outputs]  # a Python model may leave one out
    if request.batched:
        return {n: result.outputs[n] for n in names}
    return {n: result.outputs[n][0] for n in names}
