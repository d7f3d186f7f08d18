"""Triton's ``identity`` model: output = input. Measures the server's own overhead.

With ``delay_s`` (per batch) and ``delay_per_item_s`` it also stands in for an accelerator:
a batch of ``n`` sleeps ``delay_s + n * delay_per_item_s``, e.g. 10 ms + 0.5 ms/item, where a
batch of 32 costs 1/8 of batch 1 per item, the shape of a GPU's cost curve. Sleep, not
spinning, so the curve holds on a shared CPU.
"""

from __future__ import annotations

import time

import numpy as np
from wattserve.engines.base import Batch, TensorSpec


class IdentityEngine:
    platform = "identity"
    device = "cpu"
    batch_sizes = None

    def __init__(
        self,
        elements: int = 16,
        max_batch_size: int = 64,
        delay_s: float = 0.0,
        name: str = "identity",
        delay_per_item_s: float = 0.0,
    ) -> None:
        self.name = name
        self.delay_s = delay_s  # a batch's fixed compute time, like Triton's execute_delay_ms
        self.delay_per_item_s = delay_per_item_s  # plus this much per request in the batch
        self.inputs = [TensorSpec("INPUT0", (elements,), "FP32")]
        self.outputs = [TensorSpec("OUTPUT0", (elements,), "FP32")]
        self.max_batch_size = max_batch_size

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        delay = self.delay_s + self.delay_per_item_s * len(batch["INPUT0"])
        if delay:
            time.sleep(delay)
        return {"OUTPUT0": np.array(batch["INPUT0"], dtype=np.float32, copy=True)}

    def close(self) -> None:
        pass
