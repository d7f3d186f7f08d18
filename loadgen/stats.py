"""Per-request records and the HDR-histogram summaries made from them.

Percentiles always come from a full HdrHistogram (microsecond units, 3 significant digits, so
any reported value is within 0.1% of a recorded one), never from averages.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
HDR_LOWEST_US = 1
HDR_HIGHEST_US = 3_600_000_000  # one hour
HDR_DIGITS = 3
OK = "200"


@dataclass(slots=True)
class StreamTimes:
    """A streamed language-model answer as the client saw it: absolute ``perf_counter`` times
    of the first event with text (time to first token), of the first and the last event
    carrying a token (time per output token), how many events carried tokens, the output
    tokens and where their count came from (``usage``: the server's OpenAI usage; ``events``: one
    generate_stream event per token, or the ids of a whole answer; ``chunks``: OpenAI chunks
    counted when the server sent no usage)."""

    first_s: float | None = None
    first_token_s: float | None = None
    last_s: float | None = None
    token_events: int = 0
    tokens: int = 0
    token_source: str = ""
    prompt_tokens: int | None = None


@dataclass(slots=True)
class RequestRecord:
    """One request. Times are seconds from the run's start on the generator's monotonic clock.

    ``intended_s`` is when the schedule said to send it; ``sent_s`` when the client started the
    HTTP call; ``done_s`` when the whole response had been read. Latency runs from the
    intended time, so a generator or server stall is charged to every request it delayed.
    """

    index: int
    intended_s: float
    sent_s: float
    done_s: float
    status: str  # HTTP status code as text, or timeout / connection_error / client_error
    queue_ms: float | None = None
    compute_ms: float | None = None
    batch_size: int | None = None
    # language models (streamed): offsets of the first text and last token, as ``done_s``
    first_token_s: float | None = None
    last_token_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    token_source: str | None = None
    # (last - first token event) / (tokens - 1); None for one token or one event holding all
    tpot_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from the intended send time (as latency)."""
        return None if self.first_token_s is None else self.first_token_s - self.intended_s

    @property
    def latency_s(self) -> float:
        return self.done_s - self.intended_s

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.intended_s

    @property
    def ok(self) -> bool:
        return self.status == OK


def histogram(values_s: Iterable[float]) -> HdrHistogram:
    """An HDR histogram of durations given in seconds, recorded in whole microseconds."""
    h = HdrHistogram(HDR_LOWEST_US, HDR_HIGHEST_US, HDR_DIGITS)
    for v in values_s:
        h.record_value(min(max(round(v * 1e6), HDR_LOWEST_US), HDR_HIGHEST_US))
    return h


def percentile_key(p: float) -> str:
    """``99.9`` -> ``"p99.9"``, ``95`` -> ``"p95"``."""
    return f"p{p:g}"


def summarize_ms(values_s: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> dict[str, Any]:
    """count, min, mean, max and percentiles in milliseconds (None when there are no values)."""
    if not values_s:
        return {"count": 0, "min": None, "mean": None, "max": None} | {
            percentile_key(p): None for p in percentiles
        }
    h = histogram(values_s)
    # Count, min, mean and max are exact from the values (hdrh's mean walks every bucket in
    # Python, ~0.5 s); the percentiles come from the histogram.
    arr = np.asarray(values_s, dtype=np.float64)
    out: dict[str, Any] = {
        "count": int(arr.size),
        "min": float(arr.min()) * 1000.0,
        "mean": float(arr.mean()) * 1000.0,
        "max": float(arr.max()) * 1000.0,
    }
    values = h.get_percentile_to_value_dict(list(percentiles))  # one pass over the counts
    for p in percentiles:
        # A bucket's top can lie above every recorded value: never report beyond the max.
        out[percentile_key(p)] = min(values[p] / 1000.0, out["max"])
    return out


def slo_percentile_ms(ok_latencies_s: Sequence[float], failures: int, percentile: float) -> float:
    """The percentile when every failed request counts as an infinitely slow one.

    A server that sheds load with 503s must not look fast for it: failures sit above every
    success, so if more than (100 - percentile)% of requests failed the answer is infinity.
    """
    total = len(ok_latencies_s) + failures
    if total == 0:
        return math.inf
    rank = max(1, math.ceil(percentile / 100.0 * total))  # 1-based rank among all requests
    if rank > len(ok_latencies_s):
        return math.inf
    h = histogram(ok_latencies_s)
    return h.get_value_at_percentile(100.0 * rank / len(ok_latencies_s)) / 1000.0


def min_queries_for(percentile: float, tail_samples: int = 25) -> int:
    """Queries needed so that at least ``tail_samples`` of them lie beyond the percentile.

    With fewer, the percentile is decided by a handful of requests and jumps between runs.
    p95 -> 500, p99 -> 2,500, p99.9 -> 25,000.
    """
    return math.ceil(round(tail_samples / (1.0 - percentile / 100.0), 6))


def errors_by_status(records: Iterable[RequestRecord]) -> dict[str, int]:
    return dict(sorted(Counter(r.status for r in records if not r.ok).items()))


def header_means(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Means of what the server reported per request in its response headers."""

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {
        "queue_ms": mean([r.queue_ms for r in records if r.queue_ms is not None]),
        "compute_ms": mean([r.compute_ms for r in records if r.compute_ms is not None]),
        "batch_size": mean([float(r.batch_size) for r in records if r.batch_size is not None]),
    }
