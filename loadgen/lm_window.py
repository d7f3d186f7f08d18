"""A language model's figures over the measurement window, from the server's own metrics
(batchers/lm_metrics.py): tokens, TTFT and TPOT means, preemptions, the KV pool and running
sequences, and joules per output token (the window's energy shared by its tokens, as
``energy_per_inference_j`` shares it by inferences). None where the server exports nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

OUTPUT_TOKENS = "wattserve_lm_output_tokens_total"
PROMPT_TOKENS = "wattserve_lm_prompt_tokens_total"
TTFT = "wattserve_lm_time_to_first_token_seconds"
TPOT = "wattserve_lm_time_per_output_token_seconds"
PREEMPTIONS = "wattserve_lm_preemptions_total"
KV_BLOCKS = "wattserve_lm_kv_cache_blocks"
RUNNING = "wattserve_running_states"
ENERGY_STATE = "wattserve_energy_joules_total"


class Delta(Protocol):
    def total(self, name: str) -> float | None: ...
    def hist_mean(self, base: str) -> float | None: ...


class Snap(Protocol):
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]


def lm_window(delta: Delta, inside: Sequence[Snap], window_s: float | None) -> dict[str, Any] | None:
    """The window's language-model figures, or None when the server counts no tokens."""
    tokens = delta.total(OUTPUT_TOKENS)
    if tokens is None:
        return None
    energy = delta.total(ENERGY_STATE)
    ttft, tpot = delta.hist_mean(TTFT), delta.hist_mean(TPOT)
    return {
        "output_tokens": tokens,
        "prompt_tokens": delta.total(PROMPT_TOKENS),
        "output_tokens_per_s": tokens / window_s if window_s else None,
        "mean_ttft_ms": None if ttft is None else ttft * 1000.0,
        "mean_tpot_ms": None if tpot is None else tpot * 1000.0,
        "preemptions": delta.total(PREEMPTIONS),
        "kv_blocks_used_mean": _gauge_mean(inside, KV_BLOCKS, {"state": "used"}),
        "running_states_mean": _gauge_mean(inside, RUNNING, {}),
        "energy_per_output_token_j": energy / tokens if energy is not None and tokens > 0 else None,
    }


def _gauge_mean(snaps: Sequence[Snap], name: str, match: dict[str, str]) -> float | None:
    """The mean over the scrapes of the gauge's samples (summed per scrape) matching labels."""
    per_scrape = []
    for snap in snaps:
        values = [
            v
            for (sample, labels), v in snap.values.items()
            if sample == name and all(dict(labels).get(k) == want for k, want in match.items())
        ]
        if values:
            per_scrape.append(sum(values))
    return sum(per_scrape) / len(per_scrape) if per_scrape else None
