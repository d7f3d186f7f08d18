"""How fast the queue really drains: rows taken per second while work was left waiting.

Used to bound the queue by time as well as by count (``max_queue_wait_s``): a request is
refused at admission when the rows already queued would take longer than the bound to
drain at this rate. It is measured where the wait happens, at the queue's exit, so it
includes everything that slows a drain down, not only the engine's compute: an event loop
busy parsing bodies between batches, the hand-off to the engine thread and back, a policy's
own waiting, a neighbour on the CPU. The engine's compute rate said 3 s of work where
admitted requests then waited 3.7-5.4 s (p99, mobilenet_v2, JSON bodies, a busy machine).

Only the time between two takes when the first left work queued counts: then the server,
not the arrivals, set the pace. A take that empties the queue ends the measurement, so
light load (small batches, an idle engine) never makes the estimate pessimistic: a refusal
still means "at the pace this server has actually kept under backlog, this queue cannot be
served in time". Until a backlog has been measured the bound is off (the count bound holds).

Batch cost, what a batch of each size takes the engine, is learned in one place only:
``batchers.cost_model`` (the adaptive policy's).
"""

from __future__ import annotations


class DrainRate:
    """Rows per second leaving the queue under backlog, an exponentially weighted ratio of
    rows over seconds (each take weighs ``1 - decay`` of the figure)."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._rows = 0.0
        self._seconds = 0.0
        self._last: float | None = None  # the last take that left work queued
        self._taken_at = 0.0  # the last take, whatever it left
        self._taken_rows = 0

    def taken(self, rows: int, left: int, now: float) -> None:
        """A batch of ``rows`` left the queue at ``now``, leaving ``left`` rows queued."""
        last = self._last
        if last is not None:
            decay = self.decay
            self._rows = self._rows * decay + rows
            self._seconds = self._seconds * decay + (now - last)
        self._last = now if left else None
        self._taken_at = now
        self._taken_rows = rows

    def emptied(self) -> None:
        """The queue emptied some other way (expiry, cancel): the backlog ended."""
        self._last = None

    @property
    def rows_per_s(self) -> float:
        """The measured drain (0 until a backlog was measured)."""
        return self._rows / self._seconds if self._seconds > 0 else 0.0

    def wait_s(self, queued: int, now: float) -> float:
        """Seconds until ``queued`` rows (the newcomer's last) have left the queue at the
        measured pace, 0 when it is unknown: the rest of the batch taken last (its rows at
        that pace, less the time since it was taken) and then the queued rows. The first
        term matters when a batch takes about as long as the bound: mobilenet_v2's 2.4 s
        batches of 8 on a busy CPU let requests into a 1 s bound that then waited 2.9 s.
        While work waits and nothing is taken, the pace so far counts the open gap too: a
        drain that collapses under overload (an event loop parsing bodies, a starved CPU)
        lowers the estimate at once, not only at the next take."""
        rate = self.rows_per_s
        last = self._last
        if last is not None and now > last:  # backlogged and nothing taken since ``last``:
            decay = self.decay  # the gap so far counts, as if the next take ended it now
            gap_rate = (self._rows * decay + self._taken_rows) / (self._seconds * decay + now - last)
            rate = min(rate, gap_rate) if rate > 0 else gap_rate
        if rate <= 0:
            return 0.0
        current = max(0.0, self._taken_rows / rate - (now - self._taken_at))
        return current + queued / rate
