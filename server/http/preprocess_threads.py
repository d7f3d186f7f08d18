"""Threads for torch work that is not an engine's (image preprocessing), kept from starting
OpenMP teams of their own.

torch's GNU OpenMP keeps a worker team per calling thread. Engines each own one thread, and
so one team (``batchers.base.engine_thread``). A resize on another thread (asyncio's default
executor, say) would start one more team; once the process holds more OpenMP threads than
CPUs, every team's workers stop spinning between parallel regions and sleep on a futex: on a
2-CPU machine one image upload raised mobilenet_v2's context switches per batch-1 call from
~3 to ~490, for the rest of the process's life. Here each thread runs torch ops serially;
requests run in parallel across the pool's threads instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("wattserve.preprocess")

_pool: ThreadPoolExecutor | None = None


def preprocess_executor() -> ThreadPoolExecutor:
    """The process's preprocessing pool (one thread per CPU, at most 8), started on first use."""
    global _pool
    if _pool is None:
        workers = min(8, os.cpu_count() or 1)
        _pool = ThreadPoolExecutor(workers, thread_name_prefix="preprocess", initializer=serial_openmp)
    return _pool


def serial_openmp() -> None:
    """Make this thread's torch ops run without an OpenMP team (thread initializer).

    ``torch.set_num_threads`` would not do: it also sets the count every later thread starts
    with, engine threads included. OpenMP's own ``omp_set_num_threads`` sets this thread's
    count only; torch's per-thread set-up runs first (``get_num_threads``), or it would
    reset the count on this thread's first parallel op."""
    import torch

    torch.get_num_threads()
    try:
        set_threads = ctypes.CDLL(None).omp_set_num_threads
    except AttributeError:  # torch without OpenMP (its native pool): no per-thread teams to avoid
        log.debug("no OpenMP runtime loaded; preprocessing threads left as they are")
        return
    set_threads(1)
