"""Let an engine built for a few batch sizes accept every size up to its largest.

An engine with ``batch_sizes`` (CUDA-graph buckets, fixed-shape plans) can only run those
sizes. ``PaddedEngine`` pads a smaller batch up to the nearest such size, runs it, and slices
the outputs back, so a batcher may hand it any size 1..max. The padded rows are wasted work;
``padded_size(n)`` says how many there will be, so a batcher can count them
(``wattserve_batch_padded_slots_total``) without running anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from wattserve.engines.base import Batch, Engine, EngineError, TensorSpec
from wattserve.engines.profiles import (
    batch_length,
    choose_bucket,
    normalize_buckets,
    pad_batch,
    slice_outputs,
)


@runtime_checkable
class PadsBatches(Protocol):
    """An engine that runs a batch of n at some size >= n (the rest is padding)."""

    def padded_size(self, batch_size: int) -> int:
        """The size the engine will actually compute for a batch of ``batch_size``."""
        ...


def padded_slots(engine: object, batch_size: int) -> int:
    """Padded rows the engine will compute for a batch of ``batch_size`` (0 if it never pads)."""
    if isinstance(engine, PadsBatches):
        return engine.padded_size(batch_size) - batch_size
    return 0


class PaddedEngine:
    """Wraps an engine with ``batch_sizes`` so any batch size <= max runs (padded up)."""

    def __init__(self, inner: Engine, batch_sizes: Sequence[int] | None = None) -> None:
        sizes = batch_sizes if batch_sizes is not None else inner.batch_sizes
        if not sizes:
            raise ValueError(f"engine {inner.name!r} has no batch_sizes to pad up to")
        self._buckets = normalize_buckets(sizes)
        if self._buckets[-1] > inner.max_batch_size:
            raise ValueError(
                f"bucket {self._buckets[-1]} exceeds {inner.name!r} max_batch_size {inner.max_batch_size}"
            )
        self.inner = inner
        self.name: str = inner.name
        self.platform: str = inner.platform
        self.device: str = inner.device
        self.inputs: Sequence[TensorSpec] = inner.inputs
        self.outputs: Sequence[TensorSpec] = inner.outputs
        self.max_batch_size: int = self._buckets[-1]
        # Still advertised: a batcher told to form only these sizes never pads at all.
        self.batch_sizes: Sequence[int] | None = tuple(self._buckets)

    def padded_size(self, batch_size: int) -> int:
        return choose_bucket(batch_size, self._buckets)

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        try:
            n = batch_length(batch)
            target = self.padded_size(n)
        except ValueError as exc:
            raise EngineError(f"{self.name}: {exc}") from exc
        outputs = self.inner.infer(pad_batch(batch, target))
        return slice_outputs(outputs, n)

    def close(self) -> None:
        self.inner.close()
