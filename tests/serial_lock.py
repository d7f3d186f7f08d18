"""Tests marked ``serial`` run while no other test of the same pytest-xdist run does.

The README's ``python -m pytest`` runs the suite on four xdist workers (pyproject's addopts). A
test whose pass/fail depends on how fast this machine is right now (a wall-clock bound, a
deadline that must not pass, a rate it must reach) would then share the two cores with whatever
the other workers run; marked ``serial``, it gets them alone, as in a one-process run.

Two lock files in the run's shared temporary folder, taken with flock(2):

- every test holds ``run`` shared for its setup, call and teardown; a serial test holds it
  exclusively, so it starts only when the other workers' tests have ended;
- ``gate`` lets a waiting serial test in: an ordinary test takes ``run`` only while holding
  ``gate`` shared, and a serial test holds ``gate`` exclusively while it waits for and holds
  ``run``, so the other workers cannot start test after test ahead of it.

Without xdist (``-p no:xdist``, ``-n 0``) there is one process and nothing to lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "serial"


def shared_folder(config: pytest.Config) -> Path | None:
    """The folder every worker of this run sees (the parent of each worker's basetemp), or None
    when this process is not an xdist worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def turn(folder: Path, serial: bool) -> Iterator[None]:
    """Hold this test's turn: alone if ``serial``, else beside other ordinary tests."""
    gate, run = folder / "serial-gate.lock", folder / "serial-run.lock"
    if serial:
        with _flock(gate, fcntl.LOCK_EX), _flock(run, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as held:
        with _flock(gate, fcntl.LOCK_SH):
            held.enter_context(_flock(run, fcntl.LOCK_SH))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    folder = shared_folder(item.config)
    if folder is None:
        return (yield)
    with turn(folder, item.get_closest_marker(MARKER) is not None):
        return (yield)
