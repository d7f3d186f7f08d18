"""Shared by the language-model tests: tiny model folders (built once per session) and
helpers to drive an LMEngine step by step."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from wattserve.engines.lm_engine import LMEngine, LMState

from support.tiny_lm import build_tiny_lm

PROMPTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog, the quick brown fox",
    "energy",
    "a server that schedules tokens",
    "tokens, not requests, tokens, not requests, tokens",
    "batching decides energy per token",
    "hello batches hello",
    "lazy dog",
    "what batching decides is the energy per token of a server that schedules",
]


def tiny_lm_folder(root: Path, kind: str, **kwargs) -> Path:
    return build_tiny_lm(root / kind, kind, **kwargs)


def request(prompt: str, max_tokens: int = 16, **params) -> dict[str, np.ndarray]:
    """One request's inputs as LMEngine.start takes them (no batch axis)."""
    item: dict[str, np.ndarray] = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "max_tokens": np.array([max_tokens], np.int32),
    }
    for name, value in params.items():
        if name == "stop":
            import json

            item[name] = np.array([json.dumps(value).encode()], dtype=object)
        else:
            item[name] = np.array([value])
    return item


def run_all(engine: LMEngine, states: Iterable[LMState], max_steps: int = 10_000) -> int:
    """Step ``states`` together until every one is finished; returns the steps taken."""
    active = list(states)
    steps = 0
    while active:
        engine.step(active)
        active = [s for s in active if not engine.finished(s)]
        steps += 1
        assert steps < max_steps, "generation did not finish"
    return steps


def hf_greedy(folder, prompt: str, max_tokens: int) -> tuple[list[int], str]:
    """Hugging Face's own greedy generation from ``folder``: the token ids and text a served
    model must answer with."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
    new = out[0, ids.shape[1] :].tolist()
    return new, tok.decode(new, skip_special_tokens=True)
