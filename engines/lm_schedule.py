"""Token-level scheduling of one language-model step, a pure function (vLLM's scheduler shape).

Plain data in (each sequence's rank, tokens known, tokens with cached keys/values, blocks
held; the step's token budget; the free KV blocks), plain data out (how many tokens each
sequence computes this step, and which sequences are preempted). No model, no torch: the
policy is unit-tested alone (tests/test_lm_schedule.py) and the engine only executes it.

The rules, in vLLM's order:

1. Sequences are ranked by (priority, arrival order): FCFS when every priority is equal,
   priority first otherwise.
2. Sequences that hold KV blocks (running: decoding, or part-way through a chunked prefill)
   go first, best rank first: each takes ``min(remaining, budget left)`` tokens. When their
   next tokens need a block and none is free, the worst-ranked sequence holding blocks is
   preempted (its blocks freed; it is recomputed from its prompt and its tokens so far when
   it is scheduled again, as vLLM's recompute preemption), until the block fits or the
   sequence itself was the worst-ranked one.
3. Then sequences holding no block (new, or preempted) in rank order, while budget and
   blocks last: a prompt longer than the budget left (or the free blocks) is split into
   chunks (chunked prefill) so it never stalls the running decodes; ``chunked=False`` admits
   only whole prompts. The first one that does not fit stops admission (FCFS: nobody
   overtakes it).

The budget counts tokens computed this step: a decode costs one, a prefill chunk its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeqView:
    """What the policy needs to know about one sequence (plain data, copied)."""

    key: int
    priority: int  # lower is served first (Triton: 1 is the highest priority level)
    order: int  # arrival order, unique
    total: int  # tokens known: prompt + generated so far
    computed: int  # tokens whose keys/values are in the cache
    blocks: int  # KV blocks held

    @property
    def remaining(self) -> int:
        return self.total - self.computed


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """One step, decided before it runs."""

    chunks: dict[int, int]  # key -> tokens to compute this step (> 0), in rank order
    preempt: tuple[int, ...]  # keys whose blocks are freed before the step (recomputed later)

    @property
    def tokens(self) -> int:
        return sum(self.chunks.values())


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` keys/values."""
    return -(-tokens // block_size)


def schedule_tokens(
    seqs: Sequence[SeqView],
    token_budget: int,
    free_blocks: int,
    block_size: int,
    *,
    chunked: bool = True,
) -> TokenPlan:
    """The token plan of one step (see the module docstring for the rules)."""
    if token_budget < 1 or block_size < 1:
        raise ValueError("token_budget and block_size must be >= 1")
    ranked = sorted(seqs, key=lambda s: (s.priority, s.order))
    budget, free = token_budget, free_blocks
    chunks: dict[int, int] = {}
    preempted: list[int] = []
    holding = [s for s in ranked if s.blocks > 0]
    gone: set[int] = set()
    for seq in holding:
        if budget == 0:
            break
        if seq.key in gone or seq.remaining <= 0:
            continue
        n = min(seq.remaining, budget)
        need = blocks_needed(seq.computed + n, block_size) - seq.blocks
        while need > free:
            victim = next(v for v in reversed(holding) if v.key not in gone)
            gone.add(victim.key)
            preempted.append(victim.key)
            free += victim.blocks
            if victim.key == seq.key:
                break
        if seq.key in gone:
            continue
        chunks[seq.key] = n
        budget -= n
        free -= max(need, 0)
    for seq in ranked:
        if budget == 0:
            break
        if seq.blocks > 0 and seq.key not in gone:
            continue  # running: served above
        if seq.key in gone:
            continue  # preempted this step: waits at least one step
        want = seq.remaining
        n = min(want, budget, free * block_size)
        if n <= 0 or (not chunked and n < want):
            break
        chunks[seq.key] = n
        budget -= n
        free -= blocks_needed(n, block_size)
    return TokenPlan(chunks, tuple(preempted))
