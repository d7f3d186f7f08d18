"""Per-model counters in the shape of Triton's statistics extension (``/v2/models/{m}/stats``).

Counted as Triton counts them, since its tools check them against each other
(perf_analyzer stops with "Server side statistics compute counts must be the same" when
they disagree): each successful request once in each of queue, compute_input,
compute_infer and compute_output; each execution once in each of its batch size's three;
``inference_count`` in rows (a request of batch 4 is four inferences), ``execution_count``
in model executions. A batch's compute window splits into input gathering, the model call
and output scatter, timed on the engine thread.

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
class BatchDurations:
    """One batch size's executions, as Triton's ``batch_stats`` entry counts them."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def doc(self, size: int) -> dict[str, Any]:
        return {
            "batch_size": size,
            "compute_input": self.compute_input.doc(),
            "compute_infer": self.compute_infer.doc(),
            "compute_output": self.compute_output.doc(),
        }


@dataclass
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    # Every successful request is counted once in each phase, so the phases share
    # success.count and keep only their nanoseconds (four counters cost the hot path ~50
    # opcodes a request for numbers that can never differ)
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    batches: dict[int, BatchDurations] = field(default_factory=dict)  # batch size -> executions
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    # response cache (server/models/response_cache.py): hits are successes without queue or compute
    cache_hit: Duration = field(default_factory=Duration)  # lookup + reading the answer back
    cache_miss: Duration = field(default_factory=Duration)  # lookup + insert (after success)

    def record_batch(
        self,
        size: int,
        compute_s: float,
        inferences: int | None = None,
        input_s: float = 0.0,
        output_s: float = 0.0,
    ) -> None:
        """One model execution of ``size`` rows taking ``compute_s`` in all, of which
        ``input_s`` gathering inputs and ``output_s`` scattering outputs. ``inferences``:
        the rows it completed (default ``size``); an iteration-level step completes only
        the requests that finish on it, as Triton counts a decoupled model's executions and
        inferences apart."""
        stats = self.batches.get(size)
        if stats is None:
            stats = self.batches[size] = BatchDurations()
        stats.compute_input.add(input_s)
        stats.compute_infer.add(max(0.0, compute_s - input_s - output_s))
        stats.compute_output.add(output_s)
        self.inference_count += size if inferences is None else inferences
        self.execution_count += 1

    def record_success(self, seconds: float, result: Any) -> None:
        """Once per answered request (hot path: plain adds, no calls but the clock);
        ``result``: its ``batchers.types.Result``."""
        success = self.success
        success.count += 1
        success.ns += int(seconds * 1e9)
        input_s, output_s = result.input_s, result.output_s
        self.queue_ns += int(result.queue_time_s * 1e9)
        self.compute_input_ns += int(input_s * 1e9)
        self.compute_infer_ns += int((result.compute_time_s - input_s - output_s) * 1e9)
        self.compute_output_ns += int(output_s * 1e9)
        self.last_inference_ms = int(time.time() * 1000)

    def record_successes(self, entries: list[tuple[float, Any]]) -> None:
        """``record_success`` for each (seconds, result) of ``entries``, in one pass (the
        nanosecond sums rounded once, not once per request: within a nanosecond a request)."""
        if not entries:
            return
        seconds = queue = computes = inputs = outputs = 0.0
        for elapsed, result in entries:
            seconds += elapsed
            queue += result.queue_time_s
            computes += result.compute_time_s
            inputs += result.input_s
            outputs += result.output_s
        self._add_successes(len(entries), seconds, queue, computes, inputs, outputs)

    def record_counted_successes(self, entries: list[tuple[float, Any, int]]) -> None:
        """``record_success`` ``count`` times for each (seconds, result, count) of ``entries``
        (a front end's group: its members share the answer's timing)."""
        if not entries:
            return
        seconds = queue = computes = inputs = outputs = 0.0
        requests = 0
        for elapsed, result, count in entries:
            requests += count
            seconds += elapsed * count
            queue += result.queue_time_s * count
            computes += result.compute_time_s * count
            inputs += result.input_s * count
            outputs += result.output_s * count
        self._add_successes(requests, seconds, queue, computes, inputs, outputs)

    def _add_successes(self, requests: int, seconds: float, queue: float, computes: float, inputs: float,
                       outputs: float) -> None:  # fmt: skip
        """The sums of ``requests`` successes into the books (nanoseconds rounded once)."""
        self.success.count += requests
        self.success.ns += int(seconds * 1e9)
        self.queue_ns += int(queue * 1e9)
        self.compute_input_ns += int(inputs * 1e9)
        self.compute_infer_ns += int((computes - inputs - outputs) * 1e9)
        self.compute_output_ns += int(outputs * 1e9)
        self.last_inference_ms = int(time.time() * 1000)

    def phase(self, name: str) -> Duration:
        """One phase of successful requests (queue, compute_input/infer/output): counted
        once per computed request, as Triton counts them (cache hits are in ``success`` only)."""
        return Duration(self.success.count - self.cache_hit.count, getattr(self, f"{name}_ns"))

    def record_cache_hit(self, seconds: float) -> None:
        """A request answered from the response cache (then counted a success, too)."""
        self.cache_hit.add(seconds)

    def record_cache_miss(self, seconds: float) -> None:
        """A request looked up and not found: its lookup and (after success) insert time."""
        self.cache_miss.add(seconds)

    def record_failure(self, seconds: float) -> None:
        self.fail.add(seconds)

    def triton(self, name: str, version: str, rejected: int = 0) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list. ``rejected``: requests refused before
        queueing (bad input, full queue), counted as failures with no duration, as Triton does."""
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
                "queue": self.phase("queue").doc(),
                "compute_input": self.phase("compute_input").doc(),
                "compute_infer": self.phase("compute_infer").doc(),
                "compute_output": self.phase("compute_output").doc(),
                "cache_hit": self.cache_hit.doc(),
                "cache_miss": self.cache_miss.doc(),
            },
            "response_stats": {},
            "batch_stats": [d.doc(size) for size, d in sorted(self.batches.items())],
            "memory_usage": [],
        }
