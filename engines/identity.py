"""Triton's ``identity`` model: output = input. Measures the server's own overhead."""

from __future__ import annotations

import time

import numpy as np

from engines.base import Batch, TensorSpec


class IdentityEngine:
    platform = "identity"
    device = "cpu"
    batch_sizes = None

    def __init__(
        self, elements: int = 16, max_batch_size: int = 64, delay_s: float = 0.0, name: str = "identity"
    ) -> None:
        self.name = name
        self.delay_s = delay_s  # a batch's compute time, like Triton's execute_delay_ms
        self.inputs = [TensorSpec("INPUT0", (elements,), "FP32", allow_nonfinite=True)]
        self.outputs = [TensorSpec("OUTPUT0", (elements,), "FP32", allow_nonfinite=True)]
        self.max_batch_size = max_batch_size

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return {"OUTPUT0": np.array(batch["INPUT0"], dtype=np.float32, copy=True)}

    def close(self) -> None:
        pass
