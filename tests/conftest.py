"""Fixtures shared across test modules, and the suite's set-up on pytest-xdist workers."""

from __future__ import annotations

import os

import pytest

from tests import serial_lock
from tests.prometheus_fixture import prometheus_factory  # noqa: F401  (a real Prometheus on loopback)
from tests.serial_lock import pytest_runtest_protocol  # noqa: F401  (tests marked serial run alone under xdist)

# The files with a test marked serial (tests/serial_lock.py), checked at collection. Under
# pytest-xdist (pyproject's addopts: files whole, in the order below, --no-loadscope-reorder) they
# all go to one worker, first and one after another, while the other workers take files of short
# tests: a serial test then waits for a short test on each other worker, not for a 90 s one, and
# the ordinary tests of these files run beside the others' instead of queueing behind serial ones.
SERIAL_FILES = (
    "tests/conformance/test_requests_and_statuses.py",
    "tests/test_adaptive_live.py",
    "tests/test_loadgen_compare.py",
    "tests/test_loadgen_coordinated_omission.py",
    "tests/test_loadgen_e2e.py",
    "tests/test_priority_queue_policy.py",
    "tests/test_telemetry_gpu_check.py",
    "tests/test_telemetry_sampler.py",
    "tests/test_trim_after_peak.py",
)

# The files that take longest (about 15-90 s each here, mostly waiting on servers and
# subprocesses), handed out right after the serial files, so that none of them starts last and
# runs alone while the other workers have nothing left to do. Every other file keeps its place.
LONGEST_FIRST = (
    "tests/test_thesis_study.py",
    "tests/conformance/test_perf_analyzer.py",
    "tests/conformance/test_model_analyzer.py",
    "tests/test_frontend_workers.py",
    "tests/test_onnx_engine.py",
    "tests/test_loadgen_lm.py",
    "tests/test_diffusion_server.py",
    "tests/test_telemetry_gpu_report.py",
    "tests/test_python_process.py",
    "tests/test_soak_faults.py",
    "tests/test_repository_config.py",
    "tests/test_response_cache.py",
    "tests/test_vs_triton_harness.py",
    "tests/test_replicas.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The workers share the two cores: a torch call in a test process runs on one OpenMP
        # thread, as tests/diffusion_support.py found (a team of two waits at every barrier on
        # a thread the other worker has descheduled: 10x slower). Engines given a thread count
        # still set their own; servers in subprocesses are not affected.
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def path(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    serial = {path(item) for item in items if item.get_closest_marker(serial_lock.MARKER)}
    missing = serial - set(SERIAL_FILES)
    if missing:
        raise pytest.UsageError(
            f"tests/conftest.py SERIAL_FILES does not name {sorted(missing)}, which hold serial tests"
        )

    def rank(item: pytest.Item) -> int:
        if path(item) in SERIAL_FILES:
            return 0
        return 1 + (LONGEST_FIRST.index(path(item)) if path(item) in LONGEST_FIRST else len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: files keep their order within a rank and tests theirs


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from tests.file_scheduling import SerialFilesOnOneWorker

    return SerialFilesOnOneWorker(config, log, SERIAL_FILES, LONGEST_FIRST)
