"""A running mean per batch size: what the server has learned a batch of each size costs.

Used by ``CostModel`` (the shape of seconds per size, and joules per size): the one home of
what a batch costs. (The queue's time bound measures the drain itself, ``DrainRate``.)
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator


class SizeEwma:
    """Per batch size, an exponentially weighted moving average of one figure; a size's
    first observation is taken as is."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._values: dict[int, float] = {}

    def update(self, size: int, value: float) -> float:
        """Fold one observation of ``size`` in; the new average."""
        old = self._values.get(size)
        new = value if old is None else old + self.alpha * (value - old)
        self._values[size] = new
        return new

    def set(self, size: int, value: float) -> None:
        """Replace the average of ``size`` (a timed seed run)."""
        self._values[size] = value

    def get(self, size: int) -> float | None:
        return self._values.get(size)

    def items(self) -> ItemsView[int, float]:
        return self._values.items()

    def __contains__(self, size: object) -> bool:
        return size in self._values

    def __iter__(self) -> Iterator[int]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, size: int) -> float:
        return self._values[size]
