"""Fixtures shared across test modules, and the suite's set-up on pytest-xdist workers."""

from __future__ import annotations

import os

import pytest

from tests.prometheus_fixture import prometheus_factory  # noqa: F401  (a real Prometheus on loopback)
from tests.serial_lock import pytest_runtest_protocol  # noqa: F401  (tests marked serial run alone under xdist)

# The files that take longest (about 40-90 s each here): handed to the workers first, so that
# none of them starts last and runs alone while the other worker has nothing left to do.
LONGEST_FIRST = (
    "tests/test_thesis_study.py",
    "tests/test_telemetry_gpu_check.py",
    "tests/conformance/test_model_analyzer.py",
    "tests/test_lm_engine.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share the two cores: a torch call in a test process runs on one OpenMP
        # thread, as tests/diffusion_support.py found (a team of two waits at every barrier on
        # a thread the other worker has descheduled: 10x slower). Engines given a thread count
        # still set their own; servers in subprocesses are not affected.
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other file keeps its place and its tests their order
