"""Histogram buckets shared by every metrics module (serving, iteration, telemetry users).

A neutral home: batchers/ and server/ both declare histograms with these buckets, and
batchers/ must not import server/ (tests/test_layering.py), so neither owns them.
"""

from __future__ import annotations

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)
