"""tests/serial_lock.py: a test marked serial waits for the test running beside it, and the
next ordinary test waits for it (flock locks of separate open() calls exclude each other even
between threads of one process, so threads stand in for the two xdist workers)."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from tests.serial_lock import turn


def held_exclusively(path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_serial_test_runs_alone_between_ordinary_ones(tmp_path):
    log: list[str] = []
    entered = {name: threading.Event() for name in ("a", "s", "c")}
    leave = {name: threading.Event() for name in ("a", "s", "c")}

    def test(name: str, serial: bool) -> None:
        with turn(tmp_path, serial):
            log.append(f"{name} in")
            entered[name].set()
            assert leave[name].wait(30)
            log.append(f"{name} out")

    threads = {name: threading.Thread(target=test, args=(name, name == "s")) for name in ("a", "s", "c")}
    threads["a"].start()
    assert entered["a"].wait(30)
    threads["s"].start()  # asks for its turn while "a" runs
    deadline = time.monotonic() + 30
    while not held_exclusively(tmp_path / "serial-gate.lock"):  # it holds the gate, waits for "a"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not entered["s"].is_set()
    threads["c"].start()  # an ordinary test asks after it: it must not slip in ahead
    leave["a"].set()
    assert entered["s"].wait(30)
    assert not entered["c"].is_set()
    leave["s"].set()
    assert entered["c"].wait(30)
    leave["c"].set()
    for thread in threads.values():
        thread.join(30)
    assert log == ["a in", "a out", "s in", "s out", "c in", "c out"]


def test_ordinary_tests_run_side_by_side(tmp_path):
    with turn(tmp_path, False):
        done = threading.Event()

        def other() -> None:
            with turn(tmp_path, False):
                done.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert done.wait(30), "a second ordinary test waited for the first"
        thread.join(30)
