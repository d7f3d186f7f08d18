"""Per-model counters in the shape of Triton's statistics extension (``/v2/models/{m}/stats``).

Prometheus keeps histograms for dashboards; Triton's tools (perf_analyzer, model
analyzer, ``tritonclient``'s ``get_inference_statistics``) want cumulative counts and
nanosecond sums instead. Everything here is updated on the event loop (request ends in
``ModelRuntime.infer``, batches in the batcher's scatter), so plain ints suffice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    batches: dict[int, Duration] = field(default_factory=dict)  # batch size -> executions
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0

    def record_batch(self, size: int, compute_s: float, inferences: int | None = None) -> None:
        """One model execution of ``size`` rows. ``inferences``: the requests it completed
        (default ``size``); an iteration-level step completes only the requests that finish
        on it, as Triton counts a decoupled model's executions and inferences apart."""
        stats = self.batches.get(size)
        if stats is None:
            stats = self.batches[size] = Duration()
        stats.add(compute_s)
        self.inference_count += size if inferences is None else inferences
        self.execution_count += 1

    def record_success(self, seconds: float, queue_s: float, compute_s: float) -> None:
        """Once per answered request (hot path: plain adds, no calls but the clock)."""
        success, queue, compute = self.success, self.queue, self.compute_infer
        success.count += 1
        success.ns += int(seconds * 1e9)
        queue.count += 1
        queue.ns += int(queue_s * 1e9)
        compute.count += 1
        compute.ns += int(compute_s * 1e9)
        self.last_inference_ms = int(time.time() * 1000)

    def record_failure(self, seconds: float) -> None:
        self.fail.add(seconds)

    def triton(self, name: str, version: str, rejected: int = 0) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list. ``rejected``: requests refused before
        queueing (bad input, full queue), counted as failures with no duration, as Triton does."""
        zero = Duration().doc()
        fail = {"count": self.fail.count + rejected, "ns": self.fail.ns}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.doc(),
                "fail": fail,
                "queue": self.queue.doc(),
                "compute_input": zero,  # stacking is timed inside compute_infer
                "compute_infer": self.compute_infer.doc(),
                "compute_output": zero,
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": zero, "compute_infer": d.doc(), "compute_output": zero}
                for size, d in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
