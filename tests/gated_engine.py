"""Engines for tests whose compute time and failures the test controls.

These are not hardware doubles: they are real Engine implementations with a knob, like
Triton's identity model with execute_delay_ms, so batching policies can be observed.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from wattserve.engines.base import TensorSpec


class GatedEngine:
    """Doubles its input. Records every batch. ``gate`` blocks compute until set;
    ``delay_s`` adds compute time; inputs equal to ``poison`` make the batch fail."""

    platform = "test"
    device = "cpu"

    def __init__(self, max_batch_size: int = 8, delay_s: float = 0.0, poison: float | None = None,
                 batch_sizes: list[int] | None = None) -> None:  # fmt: skip
        self.name = "gated"
        self.inputs = [TensorSpec("x", (2,), "FP32")]
        self.outputs = [TensorSpec("y", (2,), "FP32")]
        self.max_batch_size = max_batch_size
        self.batch_sizes = batch_sizes
        self.delay_s = delay_s
        self.poison = poison
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()  # set when a batch starts computing
        self.batches: list[list[float]] = []  # first element of each row, per batch
        self._lock = threading.Lock()

    def infer(self, batch):
        x = batch["x"]
        with self._lock:
            self.batches.append([float(v) for v in x[:, 0]])
        self.started.set()
        self.gate.wait(timeout=30)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.poison is not None and (x == self.poison).any():
            raise RuntimeError(f"poisoned input {self.poison}")
        return {"y": (x * 2).astype(np.float32)}

    @property
    def seen(self) -> list[float]:
        return [v for b in self.batches for v in b]

    def close(self) -> None:
        pass


def item_input(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    """One request's inputs: ``rows`` rows (the batch axis first), each [value, -value]."""
    return {"x": np.tile(np.array([value, -value], dtype=np.float32), (rows, 1))}
