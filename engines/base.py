"""The engine contracts: what a batcher may ask of a model.

An engine is one loaded model, ready to run a whole batch. It is blocking and is
always called from one dedicated worker thread (one thread per engine instance),
never from the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import ml_dtypes
import numpy as np

# KServe v2 / Triton datatype names <-> numpy dtypes. numpy has no bfloat16: BF16 is
# ml_dtypes.bfloat16 (what tritonclient r26.06+ takes and returns); an engine whose library
# cannot take it (ONNX Runtime's and torch's numpy bridges) passes the raw 16-bit words.
DATATYPE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    # Triton's BYTES (TYPE_STRING in a config): each element a Python ``bytes`` object
    "BYTES": np.dtype(object),
}
NUMPY_TO_DATATYPE: dict[np.dtype, str] = {v: k for k, v in DATATYPE_TO_NUMPY.items()}
BF16 = DATATYPE_TO_NUMPY["BF16"]
VARIABLE = -1  # a dimension whose size each request chooses (Triton's -1)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of one request row: shape without the batch dimension (-1 where each
    request chooses the size), KServe datatype."""

    name: str
    shape: tuple[int, ...]
    datatype: str = "FP32"
    # Triton's ``optional`` input: a request may leave it out (the engine's ``prepare``
    # fills it in before the request is queued, so batches still hold every input).
    optional: bool = False
    # Triton's ``allow_ragged_batch``: requests whose shapes differ here still share a batch
    # (the engine concatenates their elements, ``engines.ragged``), so the shape keys no batch.
    ragged: bool = False

    @property
    def dtype(self) -> np.dtype:
        return DATATYPE_TO_NUMPY[self.datatype]

    @property
    def element_count(self) -> int:
        """Elements per row; only meaningful for a fixed shape (see ``variable``)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def variable(self) -> bool:
        """Some dimension is -1: each request gives its own size there."""
        return VARIABLE in self.shape

    def accepts(self, shape: Sequence[int]) -> bool:
        """Whether a row of ``shape`` fits this spec (-1 takes any size, 0 included)."""
        if tuple(shape) == self.shape:  # a fixed shape, the common case: one comparison
            return True
        return len(shape) == len(self.shape) and all(
            want in (VARIABLE, got) for want, got in zip(self.shape, shape, strict=True)
        )

    def metadata(self, batched: bool = True) -> dict[str, Any]:
        """KServe v2 tensor metadata; -1 marks the variable batch dimension."""
        shape = [-1, *self.shape] if batched else list(self.shape)
        return {"name": self.name, "datatype": self.datatype, "shape": shape}


Batch = Mapping[str, np.ndarray]


@runtime_checkable
class Engine(Protocol):
    """One model, ready to run a batch. Blocking; called from one worker thread.

    Every member here is required. What only some engines have is one of the capability
    protocols below (``WarmsItself``, ``ValidatesInputs``, ``ReportsSteps``, ``StepEngine``):
    callers test for it with ``isinstance`` once, when they are built, never with getattr.
    The data members are read-only properties here: callers only read them, and an engine
    may keep them as plain attributes of narrower types (a ``list``, ``None``).
    """

    name: str

    @property
    def platform(self) -> str:
        """e.g. "pytorch", "onnxruntime", "tensorrt" (shown in model metadata)."""
        ...

    @property
    def device(self) -> str:
        """e.g. "cpu", "cuda:0"."""
        ...

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int: ...

    @property
    def batch_sizes(self) -> Sequence[int] | None:
        """Sizes the engine is fastest at (TensorRT profiles, CUDA graph buckets), or None
        when any size 1..max_batch_size is equally fine."""
        ...

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        """Run one batch; every array has the batch on axis 0; outputs likewise."""
        ...

    def close(self) -> None:
        """Free the model (threads, device memory); called once, after its last batch."""
        ...


@runtime_checkable
class WarmsItself(Protocol):
    """An engine whose warm-up is its own (a batch of zeros is no valid request for it, e.g.
    diffusion's seed and steps): the server calls ``warmup`` instead of ``infer(zeros)``,
    and the adaptive batcher learns its costs from traffic instead of timing zeros."""

    def warmup(self, batch_sizes: Sequence[int]) -> None: ...


@runtime_checkable
class ValidatesInputs(Protocol):
    """An engine with model-specific checks of one whole request's inputs (batch axis first,
    the request's rows), run once before the request is queued; a ``ValueError`` is the
    client's 400."""

    def validate(self, inputs: Mapping[str, np.ndarray]) -> None: ...


@runtime_checkable
class PreparesInputs(Protocol):
    """An engine that checks one whole request (batch axis first), fills in the optional
    inputs it left out and names the request's batch key: requests batch only with
    requests of the same key (e.g. text-to-image: the latent size; None: any). Run once
    before the request is queued; a ``ValueError`` is the client's 400."""

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple | None]: ...


@runtime_checkable
class StacksItems(Protocol):
    """An engine that forms its batch from the requests' inputs itself (Triton's ragged
    batching: ragged inputs concatenated, batch inputs computed from each request's shape)
    rather than by stacking rows; each request still gets its own rows of every output."""

    def stack_items(self, items: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]: ...


StepObserver = Callable[[int, float], None]  # (states in one model call, its seconds) -> None


@runtime_checkable
class ReportsSteps(Protocol):
    """An engine that reports every model call it makes (iterative models: one UNet call
    per step of a whole batch), on its worker thread, to ``step_observer`` when one is set."""

    step_observer: StepObserver | None


@runtime_checkable
class StepEngine(Protocol):
    """An iterative model: one call advances every state by one step, each at its own step.

    A StepEngine is also an Engine (``infer`` runs whole requests to completion together),
    so request-level batchers can serve it and be compared with iteration-level batching.
    """

    name: str

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int: ...

    def start(self, item: Mapping[str, np.ndarray]) -> Any:
        """Make the state of one request (no batch dimension in ``item``)."""
        ...

    def step(self, states: Sequence[Any]) -> None:
        """Advance every state by one step in one batched model call."""
        ...

    def finished(self, state: Any) -> bool: ...

    def result(self, state: Any) -> dict[str, np.ndarray]:
        """The finished request's outputs (no batch dimension)."""
        ...

    def close(self) -> None:
        """Free the model; called once, after its last step."""
        ...


class EngineError(RuntimeError):
    """An engine failed to run a batch; the batch's requests get a 500."""


class EngineUnavailable(RuntimeError):
    """The engine cannot be built here (library or device missing); says which and why."""


def warmup_sizes(max_batch_size: int, batch_sizes: Sequence[int] | None) -> list[int]:
    """Every batch size a batcher may hand this engine, smallest first.

    Warming each of them before reporting ready keeps first-request latency out of the
    measurements (allocator growth, oneDNN/cuDNN algorithm choice, TensorRT contexts).
    """
    if batch_sizes:
        return sorted({int(b) for b in batch_sizes if 1 <= b <= max_batch_size})
    return list(range(1, max_batch_size + 1))


def zeros_batch(specs: Sequence[TensorSpec], batch_size: int) -> dict[str, np.ndarray]:
    """A batch of zeros shaped for ``specs``; used for warm-up (fixed shapes only: a zero
    request of a variable-shape model is no better a guess than any other)."""
    return {s.name: np.zeros((batch_size, *s.shape), dtype=s.dtype) for s in specs}


def warms_with_zeros(specs: Sequence[TensorSpec]) -> bool:
    """Whether a batch of zeros is a request this model can take: fixed shapes, numbers."""
    return all(not s.variable and s.datatype != "BYTES" for s in specs)
