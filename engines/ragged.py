"""Triton's ragged batching: requests of different shapes share one batch.

A ragged input (``allow_ragged_batch: true``) is concatenated, each request's elements after
the previous request's, into one 1-dimensional tensor (as Triton's ONNX Runtime, PyTorch and
TensorRT backends do), and the model learns where each request's elements are from its batch
inputs (``batch_input``), computed here from the requests' shapes once the batch is formed.
Every other input is stacked by rows as usual, and every output keeps one row per request,
so each request's answer is its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from wattserve.engines.base import DATATYPE_TO_NUMPY, Engine, TensorSpec, ValidatesInputs
from wattserve.engines.request_engines import RequestInput

# Triton's BatchInput.Kind names
KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


@dataclass(frozen=True)
class BatchInput:
    """One ``batch_input``: the tensor ``target`` the model is given, of ``kind``, computed
    from the requests' ``source`` input, as ``datatype`` (a protocol datatype)."""

    target: str
    kind: str
    datatype: str
    source: str


@dataclass(frozen=True)
class RaggedSpec:
    """A model's ragged inputs and batch inputs (from its config)."""

    ragged: frozenset[str]
    batch_inputs: tuple[BatchInput, ...]


def batch_input_value(kind: str, shapes: Sequence[tuple[int, ...]], dtype: np.dtype) -> np.ndarray:
    """Triton's value of a batch input of ``kind`` for requests whose source input has these
    shapes (batch axis excluded), one per request in batch order."""
    counts = np.array([int(np.prod(s, dtype=np.int64)) for s in shapes], dtype=np.int64)
    if kind == "BATCH_ELEMENT_COUNT":  # [3, 4]
        value = counts
    elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":  # [3, 7]: where each request's elements end
        value = np.cumsum(counts)
    elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":  # [0, 3, 7]: starts, then the end
        value = np.concatenate([[0], np.cumsum(counts)])
    elif kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":  # its shape is the value: [max count]
        return np.zeros(int(counts.max(initial=0)), dtype=dtype)
    elif kind == "BATCH_ITEM_SHAPE":  # [[3], [4]]: each request's shape
        value = np.array(shapes, dtype=np.int64).reshape(len(shapes), -1)
    elif kind == "BATCH_ITEM_SHAPE_FLATTEN":  # [3, 4]: the shapes, one after the other
        value = np.array(shapes, dtype=np.int64).reshape(-1)
    else:
        raise ValueError(f"unknown batch input kind {kind!r}")
    return value.astype(dtype)


def with_batch_inputs(
    requests: Sequence[RequestInput], batch_inputs: Sequence[BatchInput]
) -> list[RequestInput]:
    """A batch of whole requests (a Python model's) with the batch inputs added to the first
    request's inputs; the other requests as they are. (Triton's Python backend, python_be.cc,
    passes each request's own inputs only: this is wattserve's way to give them at all.)"""
    first, *rest = requests
    inputs = dict(first[0])
    for b in batch_inputs:
        shapes = [tuple(r[0][b.source].shape[1:]) for r in requests]
        inputs[b.target] = batch_input_value(b.kind, shapes, DATATYPE_TO_NUMPY[b.datatype])
    return [(inputs, *first[1:]), *rest]


class RaggedEngine:
    """An engine whose config has ragged inputs or batch inputs, around the engine that runs
    the model file (which takes the ragged inputs 1-dimensional and the batch inputs as
    inputs of its own). Requests carry one row each: a ragged request is one batch element."""

    def __init__(self, inner: Engine, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 spec: RaggedSpec) -> None:  # fmt: skip
        """``inputs`` / ``outputs``: the config's (what clients send and get)."""
        self.inner = inner
        self.name = inner.name
        self.max_batch_size = inner.max_batch_size
        self.batch_sizes = None
        self.spec = spec
        self.inputs = [replace(s, ragged=s.name in spec.ragged) for s in inputs]
        self.outputs = list(outputs) or list(inner.outputs)
        self._validate = inner.validate if isinstance(inner, ValidatesInputs) else None
        self._dtypes = {b.target: DATATYPE_TO_NUMPY[b.datatype] for b in spec.batch_inputs}
        # the inner engine's batch axis counts a ragged input's elements (or a batch input's
        # requests + 1, a max count), not requests: the batcher bounds the requests, not it
        inner.max_batch_size = np.iinfo(np.int64).max  # type: ignore[misc]

    @property
    def platform(self) -> str:
        return self.inner.platform

    @property
    def device(self) -> str:
        return self.inner.device

    def validate(self, inputs: Mapping[str, np.ndarray]) -> None:
        """A request to a ragged model is one batch element (one row): its batch inputs
        describe it whole. Then the model file's engine's own checks."""
        if self._validate is not None:
            self._validate(inputs)
        for name in self.spec.ragged | {b.source for b in self.spec.batch_inputs}:
            value = inputs.get(name)
            if value is not None and value.shape[0] != 1:
                raise ValueError(f"input {name!r}: a request to a model with ragged batching carries "
                                 f"one batch element; got batch size {value.shape[0]}")  # fmt: skip

    def stack_items(self, items: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The batch: ragged inputs' elements concatenated (1-dimensional), the others'
        rows stacked, and each batch input computed from the requests' source shapes."""
        batch: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            if spec.name not in items[0]:
                continue
            values = [item[spec.name] for item in items]
            if spec.ragged:
                batch[spec.name] = np.concatenate([v.reshape(-1) for v in values])
            else:
                batch[spec.name] = values[0] if len(values) == 1 else np.concatenate(values)
        for b in self.spec.batch_inputs:
            shapes = [tuple(item[b.source].shape[1:]) for item in items]
            batch[b.target] = batch_input_value(b.kind, shapes, self._dtypes[b.target])
        return batch

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Zeros of each size, formed as a real batch is (with its batch inputs)."""
        for size in batch_sizes:
            one = {s.name: np.zeros((1, *(max(d, 1) for d in s.shape)), dtype=s.dtype) for s in self.inputs}
            self.infer(self.stack_items([one] * size))

    def infer(self, batch: Mapping[str, np.ndarray]) -> Any:
        """Run a batch formed by ``stack_items``; a batch of stacked rows (a config's
        ``model_warmup`` sample) is formed here first, each row one request."""
        formed = all(b.target in batch for b in self.spec.batch_inputs) and all(
            batch[name].ndim == 1 for name in self.spec.ragged if name in batch
        )
        if not formed:
            rows = len(next(iter(batch.values())))
            batch = self.stack_items([{n: v[i : i + 1] for n, v in batch.items()} for i in range(rows)])
        return self.inner.infer(dict(batch))

    def close(self) -> None:
        self.inner.close()
