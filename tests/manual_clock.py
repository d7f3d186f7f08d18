"""A clock a test moves by hand (``sleep`` advances it): for code that takes its time source
as a parameter (the simulated GPU, the NVML sampler), so figures are exact, not timed."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
