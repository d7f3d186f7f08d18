"""Triton's ``reshape``: clients see the config's dims, the model gets the reshape's shape.

A thin wrapper: the batch axis stays, the rest of each tensor is reshaped (same element
count, a view, no copy for contiguous arrays). Everything else is the wrapped engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from wattserve.engines.base import Batch, Engine, TensorSpec


class ReshapedEngine:
    def __init__(self, inner: Engine, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        self.inner = inner
        self.inputs = list(inputs)  # client-side shapes
        self.outputs = list(outputs)
        self._model_in = {s.name: tuple(s.shape) for s in inner.inputs}
        for spec in self.inputs:
            _check_count(spec, self._model_in[spec.name])
        for spec, model_spec in zip(self.outputs, inner.outputs, strict=True):
            _check_count(spec, tuple(model_spec.shape))

    def __getattr__(self, name: str) -> Any:  # name, platform, device, max_batch_size, ...
        return getattr(self.inner, name)

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        fed = {
            k: v.reshape((len(v), *self._model_in[k])) if k in self._model_in else v for k, v in batch.items()
        }
        out = self.inner.infer(fed)
        shapes = {s.name: tuple(s.shape) for s in self.outputs}
        return {k: v.reshape((len(v), *shapes[k])) if k in shapes else v for k, v in out.items()}

    def close(self) -> None:
        self.inner.close()


def _check_count(spec: TensorSpec, model_shape: tuple[int, ...]) -> None:
    if int(np.prod(spec.shape)) != int(np.prod(model_shape)):
        raise ValueError(f"reshape of {spec.name!r}: dims {list(spec.shape)} and shape "
                         f"{list(model_shape)} differ in element count")  # fmt: skip
