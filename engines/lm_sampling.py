"""Next-token choice for one sequence: greedy, or sampled with temperature, top-k and top-p.

Each sampled request draws from its own ``torch.Generator`` seeded with its seed, one draw
per token, so the tokens it gets depend on its seed and its own logits only: the same seed
gives the same tokens alone or in any batch (and after a preemption, since recompute does
not draw again for tokens already chosen). The filters are Hugging Face's
(``TopKLogitsWarper``, ``TopPLogitsWarper``): top-k keeps the k largest logits, top-p the
smallest set whose probability reaches p (the most likely token always kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One request's decoding settings (OpenAI / Triton generate names)."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in 0..2^63-1, got {self.seed}")

    @property
    def sampled(self) -> bool:
        return self.temperature > 0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The request's own CPU generator (None when greedy). Unseeded requests get a fresh seed."""
    if not params.sampled:
        return None
    gen = torch.Generator(device="cpu")
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """The next token from one sequence's logits ``[vocab]`` (float32)."""
    if generator is None or not params.sampled:
        return int(torch.argmax(logits))
    scores = logits.float().cpu() / params.temperature
    if params.top_k > 0 and params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - params.top_p
        drop[-1] = False  # keep at least the most likely token
        scores = scores.masked_fill(drop.scatter(0, index, drop), float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def choose_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> list[int]:
    """The next token of each row of ``logits`` ``[rows, vocab]``: one argmax over the whole
    batch for the greedy rows (a step's tokens are mostly greedy decodes; one op, not one per
    row), ``choose`` with the row's own generator for each sampled row."""
    greedy = logits.argmax(-1).tolist()
    return [
        greedy[i] if gen is None or not p.sampled else choose(logits[i], p, gen)
        for i, (p, gen) in enumerate(zip(params, generators, strict=True))
    ]
