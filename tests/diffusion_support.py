"""Shared set-up of the diffusion tests: a quiet, predictable CPU.

This machine has 2 cores shared with other test runs. Two OpenMP threads per model call
slowed a UNet step from ~10 ms to over 100 ms whenever another process took a core (the
team's barrier waits on a descheduled thread); one thread keeps the tests fast. glibc's
allocator thresholds are raised as the server does (server.lifecycle.tune_malloc).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from wattserve.server.lifecycle import tune_malloc


@pytest.fixture(scope="module", autouse=True)
def quiet_cpu() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    tune_malloc()
    try:
        yield
    finally:
        torch.set_num_threads(before)
