"""The KV cache's block allocator: fixed-size blocks of one preallocated pool, by number.

The pool's tensors (``engines/lm_model.py``) are allocated once; this class only hands out
block numbers and takes them back, so memory is bounded by construction: when no block is
free, the scheduler (``engines/lm_schedule.py``) makes a sequence wait or preempts one,
and the allocator is never asked for more than it has.
"""

from __future__ import annotations

from collections.abc import Iterable


class BlockAllocator:
    """Free list over ``num_blocks`` block numbers. Not thread-safe: one engine thread."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._used: set[int] = set()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._used)

    def allocate(self, n: int) -> list[int]:
        """``n`` block numbers; MemoryError if fewer are free (a scheduler bug, never load)."""
        if n > len(self._free):
            raise MemoryError(f"{n} KV blocks asked, {len(self._free)} free")
        got = [self._free.pop() for _ in range(n)]
        self._used.update(got)
        return got

    def release(self, blocks: Iterable[int]) -> None:
        """Give blocks back; a block freed twice is an error (it would be handed out twice)."""
        for b in blocks:
            if b not in self._used:
                raise ValueError(f"KV block {b} is not in use")
            self._used.remove(b)
            self._free.append(b)
